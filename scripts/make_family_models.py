"""Three small transformers of three families (GPT-2, Llama, Qwen3), random weights, saved with ``save_pretrained``.

``python scripts/make_family_models.py DIR`` writes ``DIR/gpt2``, ``DIR/llama`` and ``DIR/qwen3``: four blocks of
width 32 over a vocabulary of 128 tokens, every weight and bias drawn from N(0, 0.3) (seeded: the same folders on
every machine). The three-family tutorial (docs/tutorials/families.md) runs one sweep over them; nothing is
downloaded.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers

SIZE = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, vocab_size=128, max_position_embeddings=64,
            num_attention_heads=4, bos_token_id=0, eos_token_id=0)
#: family -> its config: GPT-2's own field names; Llama with biases and grouped key/value heads; Qwen3's q/k norms.
CONFIGS = {
    "gpt2": transformers.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                                    eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": transformers.LlamaConfig(num_key_value_heads=2, attention_bias=True, mlp_bias=True, **SIZE),
    "qwen3": transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **SIZE),
}


def main(out: str) -> None:
    for family, config in CONFIGS.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0, 0.3)
        model.save_pretrained(Path(out) / family)
        print(f"{Path(out) / family}: {family}, {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models")
