"""The answer of a ``graph`` entry: how much of each prompt's graph pruning keeps, and its strongest path.

The headline counts the prompts and the nodes and edges kept; then, for the first ``PROMPTS`` prompts, the
path from an input token to the prompt's most probable logit whose product of normalised edge weights is
largest (``runner.analysis.graph.strongest_path``: each edge's share of its target's kept input). When the
entry names a ``units`` run of the same transcoders (``hooks.graph.units``), each feature on the path is
followed by its top dataset examples there: block ``l``'s features are the ``l``-th ``<mlp>.transcoder``
layer that run recorded, in the model's call order.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from runner.analysis.answers import Answer
from runner.analysis.graph import label, load_graphs, one_prompt, prompts, strongest_path
from runner.analysis.load import config_of, run_dirs
from runner.analysis.units import load_units, recorded_layers, top_units

#: How many prompts' paths the lines name, and how many top examples beside each feature.
PROMPTS = 3
EXAMPLES = 3
#: The features module's name under each spliced MLP (``hooks.types.transcoder.FEATURES``).
FEATURES = "transcoder"


def graph_paths(path: str | Path, entry: str | None = None) -> pd.DataFrame:
    """One row per node of each prompt's strongest path: the prompt's key, ``rank`` along the path, the node's
    columns, its ``label`` and the path's ``product``."""
    nodes, edges = load_graphs(path)
    if entry is not None:
        nodes, edges = nodes[nodes.hook == entry], edges[edges.hook == entry]
    rows = []
    for key in prompts(nodes):
        own = one_prompt(nodes, key).set_index("node", drop=False)
        path, product = strongest_path(own, one_prompt(edges, key))
        for rank, node in enumerate(path):
            row = own.loc[node]
            rows.append({**dict(zip(["run_dir", "hook", "step", "sample"], key)), "rank": rank,
                         **row[["node", "kind", "layer", "position", "feature", "token_id", "token"]].to_dict(),
                         "label": label(row), "product": product})
    return pd.DataFrame(rows)


def feature_examples(units_run: str | Path) -> dict[tuple[int, int], str]:
    """(block, feature) -> its top examples in the ``units`` run at ``units_run`` as ``top_units`` names them."""
    first = next(iter(run_dirs(units_run)))
    layers = [layer for layer in recorded_layers(first) if layer.endswith(f".{FEATURES}")]
    every = len(load_units(units_run))
    said: dict[tuple[int, int], list[str]] = {}
    for block, layer in enumerate(layers):
        for row in top_units(units_run, layer, k=every, examples=EXAMPLES).itertuples():
            said.setdefault((block, int(row.unit)), []).append(f"{row.input} ({row.value:.3g})")
    return {key: "; ".join(examples) for key, examples in said.items()}


def units_run_of(run_dir: Path, entry: str) -> str | None:
    saved = config_of(run_dir)
    hooks = (yaml.safe_load(saved) or {}).get("hooks", {}) if saved else {}
    return (hooks.get(entry) or {}).get("units")


def graph_answer(run_dir: Path, entry: str) -> Answer | None:
    """Nodes and edges kept over the prompts, and the strongest paths (with top examples from a units run)."""
    try:
        nodes, edges = load_graphs(run_dir)
    except FileNotFoundError:
        return None
    nodes, edges = nodes[nodes.hook == entry], edges[edges.hook == entry]
    if nodes.empty:
        return None
    table = graph_paths(run_dir, entry)
    units_run = units_run_of(run_dir, entry)
    examples = feature_examples(units_run) if units_run else {}
    count = len(prompts(nodes))
    lines = [f"{count} prompt graph{'s' if count > 1 else ''}: {int(nodes.kept.sum())} of {len(nodes)} nodes and "
             f"{int(edges.kept.sum())} edges kept by pruning; strongest paths from a token to the top logit "
             f"(largest product of each edge's share of its target's kept input):"]
    for (step, sample), path in list(table.groupby(["step", "sample"], sort=False))[:PROMPTS]:
        words = []
        for node in path.itertuples():
            beside = examples.get((node.layer, node.feature)) if node.kind == "feature" else None
            words.append(f"{node.label} [top: {beside}]" if beside else node.label)
        lines.append(f"sample {sample} (step {step}): {' -> '.join(words)} (product {path['product'].iloc[0]:.3g})")
    return Answer(lines, table)
