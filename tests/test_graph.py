"""``graph`` against a hand-written float64 attribution graph (``graph_reference``): on a two-block GPT-2 and a
two-block Llama (RMSNorm, grouped key/value heads) with random weights and random circuit-tracer transcoders
(plain and skip), every edge equals the change of the target's pre-activation when the source's vector is taken
out of the model with its attention patterns, norm scales and feature activations held fixed; the nodes are
circuit-tracer's (order, zero position, logit targets). The model runs in float32: edges agree with the float64
reference to 1e-5 of the graph's largest edge (absolute 1e-4 where edges reach 100, as a random GPT-2's logit rows
do: its small residual stream makes the final norm's frozen scale large)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

import runner
from common.errors import ConfigError
from runner.analysis.load import load_table
from graph_reference import reference_adjacency
from test_transcoder import gpt2, llama, transformers
from transcoder_folders import circuit_tracer_transcoders

pytestmark = pytest.mark.statistics

PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11], [7, 7, 30, 2, 9, 40]])


def graph_run(model, folder: Path, out: Path, ids: torch.Tensor = PROMPT, **graph) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The graph entry's tables after one pass of ``ids`` with transcoders from ``folder`` at every block's MLP."""
    entries = {"transcoder": {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(folder)},
               "graph": {"type": "graph", "layers": "blocks.*.mlp", **{"batch_size": 16, **graph}}}
    with runner.attach(model, hooks=entries, out_dir=out) as attached:
        with torch.no_grad():
            model(ids)
        attached.step()
    return load_table(out, "graph_nodes.parquet"), load_table(out, "graph_edges.parquet")


def dense(nodes: pd.DataFrame, edges: pd.DataFrame) -> torch.Tensor:
    adjacency = torch.zeros(len(nodes), len(nodes), dtype=torch.float64)
    at = torch.tensor(edges.target.tolist()), torch.tensor(edges.source.tolist())
    adjacency[at] = torch.tensor(edges.weight.tolist(), dtype=torch.float64)
    return adjacency


@pytest.mark.parametrize("family, width, batch", [("gpt2", 32, 16), ("llama", 16, 512)])
@pytest.mark.parametrize("skip", [False, True])
def test_every_edge_equals_the_hand_written_float64_direct_effect(tmp_path, family, width, batch, skip):
    """GPT-2's targets in backwards of 16 (several per prompt); Llama's all in one (as many copies as targets)."""
    model = gpt2() if family == "gpt2" else llama()
    vocab = model.config.vocab_size
    ids = PROMPT % vocab
    folder = circuit_tracer_transcoders(tmp_path / "tc", 2, width, d_sae=8, skip=skip)
    nodes, edges = graph_run(model, folder, tmp_path / "run", ids, keep_all=True, batch_size=batch)
    for sample, prompt in enumerate(ids):
        own_nodes = nodes[nodes["sample"] == sample].sort_values("node").reset_index(drop=True)
        assert own_nodes.node.tolist() == list(range(len(own_nodes)))
        expected = reference_adjacency(model, prompt, folder, own_nodes)
        got = dense(own_nodes, edges[edges["sample"] == sample])
        largest = float(expected.abs().max())
        assert largest > 0.1
        torch.testing.assert_close(got, expected, atol=1e-5 * largest, rtol=0)


def demeaned_logits(model, entries: dict, ids: torch.Tensor, out: Path, scale: torch.Tensor | None) -> torch.Tensor:
    """The last position's logits minus their mean, float64, with ``entries`` attached; ``scale``: the final
    norm's, held at the given value (``None``: the model's own), else its own returned too."""
    final = model.transformer.ln_f
    seen = {}

    def frozen(module, args, output):
        x = args[0].double()
        seen["scale"] = (x.var(-1, unbiased=False) + module.eps).sqrt()
        held = seen["scale"] if scale is None else scale
        return ((x - x.mean(-1, keepdim=True)) / held[..., None] * module.weight + module.bias).float()

    with runner.attach(model, hooks=entries, out_dir=out) as attached:
        handle = final.register_forward_hook(frozen)
        with torch.no_grad():
            logits = model(ids).logits[0, -1].double()
        handle.remove()
        attached.step()
    return logits - logits.mean(), seen["scale"]


def test_ablating_a_last_block_feature_at_the_last_position_moves_each_logit_by_its_edge(tmp_path):
    """Zeroing a feature of the last block's transcoder at the last position (``ablate`` on its features module)
    changes each target logit minus the mean logit by minus its edge weight: exactly (1e-5 of the largest), with
    the final norm's scale held at the unablated pass's, as the graph holds it; its only path to the logits is
    direct, and with the scale held the logits are linear in it. A feature of an earlier block or position acts
    through attention and later features as well, which the graph's direct effect leaves out; and with the final
    norm's scale recomputed the change differs by the scale's own change: measured on these two features, by 64%
    and 99% of the largest edge, as one feature's write is a large part of this random GPT-2's small residual
    stream (the direct effect is a first-order account, not a prediction of a real ablation there)."""
    model, ids = gpt2(), PROMPT[:1]
    folder = circuit_tracer_transcoders(tmp_path / "tc", 2, 32, d_sae=8)
    nodes, edges = graph_run(model, folder, tmp_path / "graph", ids, keep_all=True)
    last = ids.shape[1] - 1
    features = nodes[(nodes.kind == "feature") & (nodes.layer == 1) & (nodes.position == last)]
    logits = nodes[nodes.kind == "logit"]
    assert len(features) and len(logits) > 1
    transcoder = {"transcoder": {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(folder)}}
    clean, scale = demeaned_logits(model, transcoder, ids, tmp_path / "clean", None)
    for feature in features.itertuples():
        ablate = {"type": "ablate", "layers": "transformer.h.1.mlp.transcoder",
                  "index": f":, {last}, {feature.feature}"}
        ablated, _ = demeaned_logits(model, {**transcoder, "ablate": ablate}, ids, tmp_path / f"f{feature.feature}",
                                     scale)
        weight = edges.set_index(["source", "target"]).weight
        predicted = torch.tensor([weight.get((feature.node, t), 0.0) for t in logits.node], dtype=torch.float64)
        change = clean[logits.token_id.tolist()] - ablated[logits.token_id.tolist()]
        assert predicted.abs().max() > 0.1
        torch.testing.assert_close(change, predicted, atol=1e-5 * float(predicted.abs().max()), rtol=0)


@pytest.mark.parametrize("config, message", [
    (lambda: transformers.GPTNeoXConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32, vocab_size=64,
                                        num_attention_heads=4),
     "hooks.graph: the gpt_neox family's attention (GPTNeoXAttention) makes its queries and keys in neither a fused "
     "c_attn (gpt2) nor q_proj and k_proj (llama, mistral, qwen2, qwen3, gemma2, gemma3), so its patterns cannot be "
     "frozen"),
    (lambda: transformers.Gemma2Config(num_hidden_layers=2, hidden_size=16, intermediate_size=32, vocab_size=64,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=4),
     "hooks.graph: this gemma2 model caps its logits (final_logit_softcapping=30.0); a graph's logit targets are of "
     "a model without the cap"),
])
def test_a_family_whose_patterns_or_logits_a_graph_cannot_take_is_refused_in_one_line(tmp_path, config, message):
    model = transformers.AutoModelForCausalLM.from_config(config()).eval()
    folder = circuit_tracer_transcoders(tmp_path / "tc", 2, 16, d_sae=8)
    with pytest.raises(ConfigError) as refused:
        graph_run(model, folder, tmp_path / "run", PROMPT % 64)
    assert str(refused.value) == message
