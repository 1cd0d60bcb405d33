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
from runner.analysis.load import load_table
from graph_reference import reference_adjacency
from test_transcoder import gpt2, llama
from transcoder_folders import circuit_tracer_transcoders

pytestmark = pytest.mark.statistics

PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11], [7, 7, 30, 2, 9, 40]])


def graph_run(model, folder: Path, out: Path, ids: torch.Tensor = PROMPT, **graph) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The graph entry's tables after one pass of ``ids`` with transcoders from ``folder`` at every block's MLP."""
    entries = {"transcoder": {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(folder)},
               "graph": {"type": "graph", "layers": "blocks.*.mlp", "batch_size": 16, **graph}}
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


@pytest.mark.parametrize("family, width", [("gpt2", 32), ("llama", 16)])
@pytest.mark.parametrize("skip", [False, True])
def test_every_edge_equals_the_hand_written_float64_direct_effect(tmp_path, family, width, skip):
    model = gpt2() if family == "gpt2" else llama()
    vocab = model.config.vocab_size
    ids = PROMPT % vocab
    folder = circuit_tracer_transcoders(tmp_path / "tc", 2, width, d_sae=8, skip=skip)
    nodes, edges = graph_run(model, folder, tmp_path / "run", ids, keep_all=True)
    for sample, prompt in enumerate(ids):
        own_nodes = nodes[nodes["sample"] == sample].sort_values("node").reset_index(drop=True)
        assert own_nodes.node.tolist() == list(range(len(own_nodes)))
        expected = reference_adjacency(model, prompt, folder, own_nodes)
        got = dense(own_nodes, edges[edges["sample"] == sample])
        largest = float(expected.abs().max())
        assert largest > 0.1
        torch.testing.assert_close(got, expected, atol=1e-5 * largest, rtol=0)
