"""``hooks.types.graph_prune`` against the definition of circuit-tracer's ``prune_graph`` computed by hand on small
adjacencies (the influence as ``w ((I - A)^-1 - I)`` by a matrix inverse, not the power series; thresholds by
sorting in Python; the clean-up loop written out), and, where ``HOOK_RUNNER_CIRCUIT_TRACER_PYTHON`` names a venv
with circuit-tracer 0.5, against its own ``prune_graph`` on the same matrices (exact boolean masks, scores to
1e-12)."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from hooks.types.graph_prune import prune

CT_PYTHON = os.environ.get("HOOK_RUNNER_CIRCUIT_TRACER_PYTHON")
N_FEATURES, N_ERRORS, N_TOKENS, N_LOGITS = 6, 4, 3, 2


def random_graph(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A graph in circuit-tracer's layout: feature ``i`` reads features before it, errors and tokens; logits read
    every feature, error and token; errors and tokens read nothing. About a third of the edges are absent."""
    gen = torch.Generator().manual_seed(seed)
    n = N_FEATURES + N_ERRORS + N_TOKENS + N_LOGITS
    sources = N_FEATURES + N_ERRORS + N_TOKENS
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(N_FEATURES):
        allowed[i, :i] = True
        allowed[i, N_FEATURES:sources] = True
    allowed[sources:, :sources] = True
    spread = torch.rand(n, n, generator=gen, dtype=torch.float64) ** 3
    weights = torch.randn(n, n, generator=gen, dtype=torch.float64) * spread
    weights *= allowed & (torch.rand(n, n, generator=gen) > 0.33)
    probabilities = torch.softmax(torch.randn(N_LOGITS, generator=gen, dtype=torch.float64), 0)
    return weights, probabilities


def by_hand(a: np.ndarray, p: np.ndarray, node_threshold: float, edge_threshold: float):
    """circuit-tracer's ``prune_graph``, definition by definition, in numpy."""
    n = len(a)
    w = np.zeros(n)
    w[-N_LOGITS:] = p

    def rows(m):
        s = np.abs(m).sum(1, keepdims=True)
        return np.abs(m) / np.maximum(s, 1e-10)

    def influence(m):
        return w @ (np.linalg.inv(np.eye(n) - m) - np.eye(n))

    def cut(scores, fraction):
        ordered = sorted(scores, reverse=True)
        total, running = sum(ordered), 0.0
        for value in ordered:
            running += value
            if running / total >= fraction:
                return value
        return ordered[-1]

    node_influence = influence(rows(a))
    nodes = node_influence >= cut(list(node_influence), node_threshold)
    nodes[-N_LOGITS - N_TOKENS:] = True
    pruned = a * nodes[:, None] * nodes[None, :]
    normal = rows(pruned)
    scores = normal * (influence(normal) + w)[:, None]
    edges = scores >= cut(list(scores.flatten()), edge_threshold)
    inner = n - N_LOGITS - N_TOKENS
    while True:
        before = nodes.copy()
        for j in range(inner):  # a feature or error node keeps an outgoing edge
            nodes[j] &= edges[:, j].any()
        for j in range(N_FEATURES):  # a feature keeps an incoming edge
            nodes[j] &= edges[j].any()
        edges &= nodes[:, None] & nodes[None, :]
        if (nodes == before).all():
            break
    order = np.argsort(-node_influence, kind="stable")
    cumulative = np.zeros(n)
    cumulative[order] = np.cumsum(node_influence[order]) / node_influence.sum()
    return nodes, edges, cumulative


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("node_threshold, edge_threshold", [(0.8, 0.98), (0.5, 0.7), (0.95, 0.99)])
def test_pruning_equals_the_definition_computed_by_hand(seed, node_threshold, edge_threshold):
    a, p = random_graph(seed)
    kept = prune(a, p, N_FEATURES, N_TOKENS, node_threshold, edge_threshold)
    nodes, edges, cumulative = by_hand(a.numpy(), p.numpy(), node_threshold, edge_threshold)
    assert kept.nodes.tolist() == nodes.tolist()
    assert kept.edges.numpy().tolist() == edges.tolist()
    np.testing.assert_allclose(kept.influence.numpy(), cumulative, rtol=0, atol=1e-12)
    assert 0 < int(kept.nodes[:N_FEATURES + N_ERRORS].sum()) or node_threshold < 1.0


def test_a_feature_left_without_a_kept_edge_is_dropped_with_its_edges():
    """Feature 1 reads only token 0, weakly, and feeds feature 0's row alone; once the edge threshold drops its
    only outgoing edge, the clean-up drops it and every edge it had."""
    n = N_FEATURES + N_ERRORS + N_TOKENS + N_LOGITS
    tokens, logits = N_FEATURES + N_ERRORS, N_FEATURES + N_ERRORS + N_TOKENS
    a = torch.zeros(n, n, dtype=torch.float64)
    a[logits, 0] = 1.0         # feature 0 -> logit
    a[0, tokens] = 1.0         # token 0 -> feature 0
    a[0, 1] = 1e-3             # feature 1 -> feature 0, weak
    a[1, tokens + 1] = 1.0     # token 1 -> feature 1
    a[logits, tokens + 2] = 1.0
    kept = prune(a, torch.tensor([1.0, 0.0], dtype=torch.float64), N_FEATURES, N_TOKENS, 1.0, 0.9)
    assert kept.nodes[0] and not kept.nodes[1]
    assert not kept.edges[1].any() and not kept.edges[:, 1].any()


CT_SCRIPT = """
import json, sys, types, torch
from circuit_tracer.graph import prune_graph
torch.set_default_dtype(torch.float64)  # its logit weights are made in the default dtype
cases = json.load(open(sys.argv[1])); out = []
for case in cases:
    a = torch.tensor(case["a"], dtype=torch.float64)
    graph = types.SimpleNamespace(input_tokens=torch.zeros(case["tokens"]), logit_targets=[0] * len(case["p"]),
                                  selected_features=torch.zeros(case["features"]), adjacency_matrix=a,
                                  logit_probabilities=torch.tensor(case["p"], dtype=torch.float64))
    result = prune_graph(graph, case["node_threshold"], case["edge_threshold"])
    out.append({"nodes": result.node_mask.tolist(), "edges": result.edge_mask.tolist(),
                "scores": result.cumulative_scores.tolist()})
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.mark.skipif(not CT_PYTHON, reason="HOOK_RUNNER_CIRCUIT_TRACER_PYTHON names no venv with circuit-tracer 0.5")
def test_pruning_equals_circuit_tracer_s_own_prune_graph(tmp_path):
    cases = []
    for seed in range(4):
        a, p = random_graph(seed)
        cases.append({"a": a.tolist(), "p": p.tolist(), "tokens": N_TOKENS, "features": N_FEATURES,
                      "node_threshold": 0.8, "edge_threshold": 0.98})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "prune.py").write_text(CT_SCRIPT)
    subprocess.run([CT_PYTHON, str(tmp_path / "prune.py"), str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                   check=True, capture_output=True, text=True, timeout=300)
    theirs = json.loads((tmp_path / "out.json").read_text())
    for case, their in zip(cases, theirs):
        a, p = torch.tensor(case["a"], dtype=torch.float64), torch.tensor(case["p"], dtype=torch.float64)
        kept = prune(a, p, N_FEATURES, N_TOKENS)
        assert kept.nodes.tolist() == their["nodes"]
        mine = kept.edges & kept.nodes[:, None] & kept.nodes[None, :]
        assert mine.tolist() == (torch.tensor(their["edges"]) & kept.nodes[:, None] & kept.nodes[None, :]).tolist()
        np.testing.assert_allclose(kept.influence.numpy(), their["scores"], rtol=0, atol=1e-12)
