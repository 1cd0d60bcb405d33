"""circuit-tracer 0.5's attribution graph of one prompt, offline: run by circuit-tracer's own python
(``HOOK_RUNNER_CIRCUIT_TRACER_PYTHON``), never imported by the project's tests (``tests/graph_oracle.py`` runs it).

    python circuit_tracer_graph.py MODEL_DIR TRANSCODER_DIR IDS_JSON OUT_DIR [BATCH_SIZE]

``MODEL_DIR``: a transformers ``save_pretrained`` folder (GPT-2 or Llama) with a tokenizer transformers 4 reads.
The model goes through circuit-tracer's TransformerLens backend: its nnsight backend has no GPT-2 mapping and
does not import beside nnsight 0.8 (``from nnsight.intervention.tracing.tracer import Barrier``). TransformerLens
3's ``HookedTransformer.from_pretrained`` accepts only official hub names, so the model is built from its config
(``get_pretrained_model_config`` and ``get_pretrained_state_dict`` read a local folder; one whose path contains
"llama" or "gemma" is taken for a hub model of that name, so the folder is read through a link named ``model``)
without any processing (no folded norms, no centred weights, no folded value biases: the folder's own numbers). ``TRANSCODER_DIR``: a circuit-tracer per-layer folder
(``config.yaml`` + ``layer_<i>.safetensors``), loaded by its ``load_transcoders`` from local paths. ``IDS_JSON``:
the prompt's token ids (circuit-tracer prepends a special token unless the first id is one). ``attribute`` runs
with its defaults (``max_n_logits=10``, ``desired_logit_prob=0.95``).

Writes to ``OUT_DIR``: ``graph.safetensors`` (the Graph's tensors, the replacement model's logits and
``prune_graph``'s masks and cumulative scores at its defaults 0.8 / 0.98), ``graph.json`` (the prompt's tokens and
the logit targets, decoded) and ``oracle.json``, what ``create_graph_files(graph, slug="oracle", scan="oracle")``
writes."""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from circuit_tracer import attribute
from circuit_tracer.graph import prune_graph
from circuit_tracer.utils.create_graph_files import create_graph_files
from circuit_tracer.utils.hf_utils import load_transcoders

SLUG = "oracle"


def transcoders(folder: Path):
    """The per-layer transcoders of ``folder``, from local paths only (no ``repo_id``: nothing is downloaded)."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    layers = sorted(folder.glob("layer_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    config.update(transcoders=[str(p) for p in layers], scan=SLUG)
    return load_transcoders(config, torch.device("cpu"), torch.float32, lazy_encoder=False, lazy_decoder=False)


def transformer_lens_model(folder: Path, tcs):
    """circuit-tracer's TransformerLens replacement model of the folder, with the folder's weights unprocessed."""
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as loading

    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel

    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cfg = loading.get_pretrained_model_config(str(folder), hf_cfg=hf_model.config.to_dict(), fold_ln=False,
                                              device="cpu", dtype=torch.float32)
    plain = HookedTransformer(cfg, tokenizer)
    plain.load_and_process_state_dict(loading.get_pretrained_state_dict(str(folder), cfg, hf_model), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    model = TransformerLensReplacementModel.from_config(cfg, tcs, tokenizer=tokenizer)
    # the replacement model wraps each MLP and the unembedding in a module of its own (old_mlp, old_unembed)
    wrapped = {re.sub(r"^(blocks\.\d+\.)?(mlp|unembed)\.", lambda m: f"{m.group(1) or ''}{m.group(2)}.old_{m.group(2)}.",
                      name): value for name, value in plain.state_dict().items()}
    missing, unexpected = model.load_state_dict(wrapped, strict=False)
    assert not unexpected and all(name.startswith("transcoders.") for name in missing), (missing, unexpected)
    return model


def main(model_dir: str, transcoder_dir: str, ids: str, out_dir: str, batch_size: str = "8") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.symlink_to(Path(model_dir).resolve())
        attribute_and_write(folder, transcoders(Path(transcoder_dir)), torch.tensor(json.loads(ids)), out,
                            int(batch_size))


def attribute_and_write(folder: Path, tcs, prompt: torch.Tensor, out: Path, batch_size: int) -> None:
    """The graph, its pruning and its JSON, written to ``out`` as the module's docstring says."""
    model = transformer_lens_model(folder, tcs)
    graph = attribute(prompt, model, batch_size=batch_size)
    node_mask, edge_mask, cumulative = prune_graph(graph)
    tensors = {"adjacency_matrix": graph.adjacency_matrix, "active_features": graph.active_features,
               "selected_features": graph.selected_features, "activation_values": graph.activation_values,
               "logit_token_ids": graph.logit_token_ids, "logit_probabilities": graph.logit_probabilities,
               "input_tokens": graph.input_tokens, "node_mask": node_mask, "edge_mask": edge_mask,
               "cumulative_scores": cumulative, "n_layers": torch.tensor(graph.cfg.n_layers),
               "logits": model(graph.input_tokens.unsqueeze(0))[0].detach()}
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(out / "graph.safetensors"))
    (out / "graph.json").write_text(json.dumps({
        "input_tokens": [model.tokenizer.decode(t) for t in graph.input_tokens.tolist()],
        "logit_tokens": [target.token_str for target in graph.logit_targets]}))
    # its metadata file wants a path with a parent
    create_graph_files(graph, slug=SLUG, output_path=str(out.resolve()), scan=SLUG)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(*sys.argv[1:])
