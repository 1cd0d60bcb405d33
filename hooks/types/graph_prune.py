"""Pruning an attribution graph by cumulative influence: circuit-tracer 0.5's ``prune_graph``, in plain torch.

The adjacency ``A`` holds rows for targets and columns for sources, nodes in circuit-tracer's order (features,
errors, embeddings, logits). Each row is normalised to the absolute values' sum; a node's influence is the sum,
over every path length, of the logits' probabilities carried back along the normalised rows (``w A + w A^2 +
...``). The nodes holding ``node_threshold`` of the total influence are kept (embeddings and logits always), then
the edges holding ``edge_threshold`` of the edges' influence among them; a feature or error node left without a
kept outgoing edge, or a feature without a kept incoming one, is dropped, until nothing changes.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Pruned(NamedTuple):
    nodes: torch.Tensor  #: bool per node: kept
    edges: torch.Tensor  #: bool per (target, source): kept
    influence: torch.Tensor  #: per node: the fraction of the total influence held by nodes at least as influential


def normalised(matrix: torch.Tensor) -> torch.Tensor:
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=1e-10)


def influence(matrix: torch.Tensor, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """``weights @ (A + A^2 + ...)``: ``A`` is nilpotent (a graph without cycles), so the sum ends."""
    current = weights @ matrix
    total = current.clone()
    for _ in range(max_iter):
        if not current.any():
            return total
        current = current @ matrix
        total += current
    raise RuntimeError(f"the influence did not vanish after {max_iter} path lengths: the graph has a cycle")


def threshold(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """The smallest score among the largest scores that together hold ``fraction`` of the total."""
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / ordered.sum()
    return ordered[min(int(torch.searchsorted(cumulative, fraction)), len(ordered) - 1)]


def prune(adjacency: torch.Tensor, probabilities: torch.Tensor, n_features: int, n_tokens: int,
          node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The nodes and edges kept, and each node's cumulative influence (module docstring)."""
    n_logits = len(probabilities)
    weights = adjacency.new_zeros(adjacency.shape[0])
    weights[-n_logits:] = probabilities
    node_influence = influence(normalised(adjacency), weights)
    nodes = node_influence >= threshold(node_influence, node_threshold)
    nodes[-n_logits - n_tokens:] = True
    matrix = adjacency.clone()
    matrix[~nodes] = 0
    matrix[:, ~nodes] = 0
    rows = normalised(matrix)
    edge_scores = rows * (influence(rows, weights) + weights)[:, None]
    edges = edge_scores >= threshold(edge_scores.flatten(), edge_threshold)
    inner = slice(0, adjacency.shape[0] - n_logits - n_tokens)  # features and errors
    while True:
        before = nodes.clone()
        nodes[inner] &= edges[:, inner].any(0)  # an outgoing edge kept
        nodes[:n_features] &= edges[:n_features].any(1)  # a feature's incoming edge kept
        edges[~nodes] = False
        edges[:, ~nodes] = False
        if torch.equal(nodes, before):
            break
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative = node_influence.new_zeros(node_influence.shape)
    cumulative[order] = torch.cumsum(ordered, dim=0) / ordered.sum()
    return Pruned(nodes, edges, cumulative)
