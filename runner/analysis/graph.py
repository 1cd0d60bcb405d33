"""Attribution graphs read back: the ``graph`` entries' tables, each prompt's strongest path, and its picture.

``load_graphs(path)`` gives the nodes and edges of one run or of every job of a sweep merged
(``load_table``: a sharded sweep's prompts side by side, each job's overrides and ``run_dir`` as columns).
``strongest_path(nodes, edges)`` follows one prompt's kept edges from the input tokens to its most probable logit
and returns the path whose product of normalised edge weights is largest, a weight normalised by the sum of
the absolute weights of its target's kept incoming edges (the share of the target's input it carries, as
circuit-tracer's influence normalises rows): exact, by dynamic programming over the layers (every edge goes
from a lower layer to a higher one). ``graph_picture`` draws one prompt's pruned graph: nodes by layer (rows:
embeddings at the bottom, logits on top, spread most probable first) and position (columns), edges by weight
(width: the normalised weight; blue positive, red negative), the strongest path in black;
``plots=[attribution_graph]`` draws the first prompt of a step into the run directory (``attribution_graph.png``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from common.records import GRAPH_EDGES, GRAPH_NODES
from hooks.specs import HOOK_TYPES
from runner.analysis.load import load_table
from runner.config.registry import PLOTS

#: The picture's name (``plots=[attribution_graph]``), which the ``graph`` type declares its own.
PICTURE = "attribution_graph"
#: The columns naming one prompt's graph among the merged rows.
PROMPT = ["run_dir", "hook", "step", "sample"]
#: Node marker by kind.
MARKERS = {"embedding": "s", "feature": "o", "error": "D", "logit": "^"}


def load_graphs(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The nodes and edges the ``graph`` entries of the run at ``path`` (or of every run under it) wrote."""
    nodes = load_table(path, GRAPH_NODES)
    if nodes.empty:
        raise FileNotFoundError(f"no run at or under '{path}' wrote {GRAPH_NODES} (add hooks=[transcoder,graph])")
    return nodes, load_table(path, GRAPH_EDGES)


def prompts(nodes: pd.DataFrame) -> list[tuple]:
    """The prompts' keys (``PROMPT``) in the order the rows hold them."""
    return list(dict.fromkeys(map(tuple, nodes[PROMPT].astype(object).to_numpy())))


def one_prompt(rows: pd.DataFrame, key: tuple) -> pd.DataFrame:
    mask = np.ones(len(rows), dtype=bool)
    for column, value in zip(PROMPT, key):
        mask &= (rows[column].astype(object) == value).to_numpy()
    return rows[mask]


def label(node) -> str:
    """A node in words: ``L1 F3 @4``, ``error L0 @2``, ``'the' @0``, ``logit 'cat'``."""
    said = node.token if isinstance(node.token, str) else f"#{node.token_id}"
    if node.kind == "feature":
        return f"L{node.layer} F{node.feature} @{node.position}"
    if node.kind == "error":
        return f"error L{node.layer} @{node.position}"
    if node.kind == "embedding":
        return f"{said!r} @{node.position}"
    return f"logit {said!r}"


def shares(edges: pd.DataFrame) -> pd.Series:
    """Each kept edge's share of its target's kept input: ``|weight|`` over the target's sum of ``|weight|``;
    0 where that sum is 0 or a weight is not a number (no share to draw or to follow)."""
    kept = edges[edges.kept]
    size = kept.weight.abs()
    return (size / size.groupby(kept.target.to_numpy()).transform("sum").to_numpy()).fillna(0.0)


def strongest_path(nodes: pd.DataFrame, edges: pd.DataFrame) -> tuple[list[int], float]:
    """One prompt's path from an input token to its most probable logit with the largest product of shares
    (``shares``) over kept edges, as node ids from the token; ``([], 0.0)`` when no kept path reaches it."""
    kept = edges[edges.kept]
    share = shares(edges)
    layer = dict(zip(nodes.node, nodes.layer))
    best: dict[int, tuple[float, int | None]] = {int(n): (1.0, None) for n in nodes.node[nodes.kind == "embedding"]}
    incoming = pd.DataFrame({"source": kept.source.to_numpy(), "target": kept.target.to_numpy(),
                             "share": share.to_numpy()})
    incoming["layer"] = incoming.target.map(layer)
    for _, group in incoming.sort_values("layer", kind="stable").groupby("layer", sort=True):
        for target, into in group.groupby("target"):
            reached = [(best[s][0] * w, s) for s, w in zip(into.source, into.share) if s in best]
            if reached:
                best[int(target)] = max(reached)
    logits = nodes[nodes.kind == "logit"]
    top = int(logits.node[logits.probability.idxmax()]) if len(logits) else None
    if top not in best:
        return [], 0.0
    path, at = [], top
    while at is not None:
        path.append(int(at))
        at = best[at][1]
    return path[::-1], best[top][0]


def graph_picture(nodes: pd.DataFrame, edges: pd.DataFrame, title: str = "") -> Figure:
    """One prompt's kept nodes by layer (rows) and position (columns) and its kept edges by weight."""
    nodes = nodes[nodes.kept]
    kept = edges[edges.kept & edges.source.isin(nodes.node) & edges.target.isin(nodes.node)]
    n_layers = int(nodes.layer.max())
    positions = int(nodes.position.max()) + 1
    where = {}
    for (row, position), group in nodes[nodes.kind != "logit"].groupby(["layer", "position"]):
        offsets = np.linspace(-0.3, 0.3, len(group)) if len(group) > 1 else [0.0]
        where |= {int(n): (position + dx, row) for n, dx in zip(group.node, offsets)}
    logits = nodes[nodes.kind == "logit"].node  # spread along the top row, most probable first
    spread = np.linspace(0, positions - 1, len(logits)) if len(logits) > 1 else [positions - 1]
    where |= {int(n): (x, n_layers) for n, x in zip(logits, spread)}
    fig = Figure(figsize=(3.0 + 1.1 * max(positions, len(logits)), 1.1 * (n_layers + 3)))
    ax = fig.subplots()
    share = shares(edges).reindex(kept.index)
    for edge, size in zip(kept.itertuples(), share):
        (x0, y0), (x1, y1) = where[edge.source], where[edge.target]
        ax.plot([x0, x1], [y0, y1], color="tab:blue" if edge.weight > 0 else "tab:red",
                linewidth=0.3 + 3 * size, alpha=0.25 + 0.6 * size, zorder=1)
    path, product = strongest_path(nodes, edges)
    ax.plot([where[n][0] for n in path], [where[n][1] for n in path], color="black", linewidth=2.5, zorder=2,
            label=f"strongest path (product of shares {product:.3g})")
    for kind, group in nodes.groupby("kind"):
        ax.scatter([where[n][0] for n in group.node], [where[n][1] for n in group.node], marker=MARKERS[kind],
                   s=60, zorder=3, label=kind, edgecolors="black", linewidths=0.5)
    for node in nodes.itertuples():
        if node.kind in ("embedding", "logit") or node.node in path:
            x, y = where[node.node]
            said = f"{label(node)}\np={node.probability:.2f}" if node.kind == "logit" else label(node)
            ax.annotate(said, (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    ax.set_yticks(range(-1, n_layers + 1), ["embed", *[f"L{i}" for i in range(n_layers)], "logits"])
    ax.set_xticks(range(positions))
    ax.set_xlabel("position")
    ax.set_ylim(-1.6, n_layers + 1.0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "attribution graph (pruned)", fontsize=9)
    fig.tight_layout()
    return fig


@PLOTS.register(PICTURE)
class AttributionGraphPicture:
    """``plots=[attribution_graph]`` (the interface of ``runner.analysis.plots.Picture``, which imports this module)."""

    keeps_input = False

    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        if any(GRAPH_NODES in hook.writes for hook in hooks):
            return None
        return "a graph entry; add hooks=[transcoder,graph] (a causal language model with transcoders)"

    @staticmethod
    def draw(run_dir, cfg, step, notes):
        try:
            nodes, edges = load_graphs(run_dir)
        except FileNotFoundError:
            if any(PICTURE in spec.pictures for spec in _specs(cfg)):
                notes.append(f"{PICTURE}: the run wrote no {GRAPH_NODES}")
            return []
        at_step = nodes[nodes.step == step]
        if at_step.empty:
            notes.append(f"{PICTURE}: no graph at step {step}")
            return []
        key = prompts(at_step)[0]
        title = f"attribution graph of sample {key[3]} (step {step}, {key[1]}), pruned"
        return [(f"{PICTURE}.png", graph_picture(one_prompt(nodes, key), one_prompt(edges, key), title))]


def _specs(cfg) -> list:
    specs = [HOOK_TYPES.schema_of((entry or {}).get("type")) for entry in (cfg or {}).get("hooks", {}).values()]
    return [spec for spec in specs if spec is not None]
