"""The answers of entries that record statistics: a ``clamp`` entry's (how many gradients and what
fraction of their elements it clipped, per layer group) and any other recording entry's (the layers
with the largest and smallest gradient norm, the output norm when it recorded no gradient, and the
layers that look dead or non-finite: ``load.abnormal``).

A ``clamp`` entry's ``clipped`` rows hold what it removed: ``1 - zero_frac`` of each is the fraction
clipped. A run of several ranks counts each tensor once (``once_per_tensor``): the rows every rank
records alike (its part manifests' ``common.ranks.SAME_ON_EVERY_RANK``: all of them when every rank
ran the whole batch, as the CLI's FSDP2 run does; the whole-tensor rows of FSDP2's sharded
gradients) are read from the first rank only, and each rank's own rows (DDP: its batch) from every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from common.ranks import SAME_ON_EVERY_RANK
from runner.analysis.answers import Answer
from runner.analysis.intact import read_manifest
from runner.analysis.load import GRADIENT_KINDS, abnormal, label_of, load_stats

#: The statistic columns the answers read (a sweep is never read whole).
COLUMNS = ["step", "call", "hook", "layer", "phase", "kind", "slot", "numel", "l2", "zero_frac",
           "nan_count", "inf_count"]
#: The columns that name one tensor's row of a step (a rank records each once).
ROW_KEY = ["hook", "layer", "phase", "kind", "slot"]
#: Kinds whose norm a recording entry's answer names, the first one the entry recorded.
NORM_KINDS = ("grad_output", "param_grad", "grad_input", "output", "input")
#: Layers named per problem, and layer groups per clip line.
MOST_NAMES = 4


@dataclass(frozen=True)
class Clipped:
    """What one clamp entry did: ``gradients`` of ``of`` clamped tensors had an element clipped,
    ``elements`` of ``numel`` elements were clipped."""

    gradients: int
    of: int
    elements: int
    numel: int

    @property
    def fraction(self) -> float:
        return self.elements / self.numel if self.numel else float("nan")

    def __str__(self) -> str:
        return f"{self.elements:,} of {self.numel:,} elements ({percent(self.fraction)})"


def clipped(rows: pd.DataFrame) -> Clipped:
    """The ``clipped`` rows' totals (training passes); ``rows`` of one entry or of several."""
    rows = rows[rows["kind"] == "clipped"]
    numel = rows["numel"].to_numpy(np.int64)
    elements = np.rint(numel * (1 - rows["zero_frac"].to_numpy(np.float64))).astype(np.int64)
    return Clipped(int((elements > 0).sum()), len(rows), int(elements.sum()), int(numel.sum()))


def layer_group(layer: str, depth: int) -> str:
    """The first ``depth`` parts of a layer's name (``layer1`` of ``layer1.0.conv1`` at depth 1)."""
    return ".".join((layer or "(model)").split(".")[:depth])


def group_depth(layers) -> int:
    """The shallowest depth at which the layers fall into more than one group (1 for a resnet:
    ``conv1``, ``layer1``, ..., ``fc``; 2 under a single top module such as ``transformer``)."""
    layers = [str(layer) for layer in layers]
    deepest = max((layer.count(".") + 1 for layer in layers), default=1)
    for depth in range(1, deepest + 1):
        if len({layer_group(layer, depth) for layer in layers}) > 1:
            return depth
    return 1


def norms(rows: pd.DataFrame, kind: str) -> pd.Series:
    """Each captured tensor's mean l2 over the training steps, by plot label, in depth order."""
    rows = rows[(rows["kind"] == kind) & (rows["phase"] != "eval")]
    if kind == "param_grad" and (rows["phase"] == "after_backward").any():
        rows = rows[rows["phase"] == "after_backward"]
    labels = [label_of(layer, kind, slot, call) for layer, slot, call in zip(rows["layer"], rows["slot"], rows["call"])]
    return rows.assign(label=labels).groupby("label", sort=False)["l2"].mean()


def once_per_tensor(stats: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """``stats`` of one run with each tensor's row once: of the rows every rank records alike (its first
    part's ``SAME_ON_EVERY_RANK``), the first rank's only; every rank's own rows stay."""
    if stats.empty or stats["rank"].nunique() < 2:
        return stats
    ranks = read_manifest(run_dir)["ranks"]  # rows of several ranks: a run over its ranks' parts
    first = min(ranks, key=int)
    same = read_manifest(run_dir / ranks[first]).get(SAME_ON_EVERY_RANK) or []
    elsewhere = stats["rank"] != int(first)
    if same is True:
        return stats[~elsewhere]
    keys = pd.MultiIndex.from_frame(stats[ROW_KEY].astype(str))
    shared = keys.isin([tuple(key) for key in same]) if same else np.zeros(len(stats), dtype=bool)
    return stats[~(elsewhere & shared)]


def entry_rows(run_dir: Path, entry: str) -> pd.DataFrame:
    """The training rows entry ``entry`` recorded in the run at ``run_dir``, each tensor's once."""
    stats = load_stats(run_dir, columns=COLUMNS, filters=[("hook", "=", entry)])
    return once_per_tensor(stats[stats["phase"] != "eval"], run_dir)


def clamp_answer(run_dir: Path, entry: str) -> Answer | None:
    """How many gradients and elements the clamp entry clipped, in total and per layer group (the
    table: one row per layer group, last layer first as the gradients come, with ``clipped`` the fraction)."""
    rows = entry_rows(run_dir, entry)
    if not (rows["kind"] == "clipped").any():
        return recorded_answer(run_dir, entry, rows)
    total = clipped(rows)
    depth = group_depth(rows["layer"].unique())
    groups = rows.assign(group=[layer_group(layer, depth) for layer in rows["layer"]])
    per = {group: clipped(part) for group, part in groups.groupby("group", sort=False, observed=True)}
    table = pd.DataFrame([(group, c.gradients, c.of, c.elements, c.numel, c.fraction)  # gradients come last layer first
                          for group, c in per.items()][::-1],
                         columns=["group", "gradients", "of", "elements", "numel", "clipped"])
    per_group = [f"{group} {percent(fraction)}" for group, fraction in zip(table["group"], table["clipped"])]
    return Answer([f"clipped {total.gradients} of {total.of} gradients, {total}",
                   "per layer group: " + capped(per_group, 2 * MOST_NAMES)], table)


def recorded_answer(run_dir: Path, entry: str, rows: pd.DataFrame | None = None) -> Answer | None:
    """Of any entry that recorded statistics: the largest and smallest norm of the first of
    ``NORM_KINDS`` it recorded (its one norm when it recorded one tensor), and the layers that look dead or non-finite (the table: each
    tensor's mean l2 by label, in depth order); ``None`` when it recorded no row."""
    rows = entry_rows(run_dir, entry) if rows is None else rows
    if rows.empty:
        return None
    kinds = [k for k in NORM_KINDS if (rows["kind"] == k).any()]
    if not kinds:
        return Answer([f"{len(rows)} rows of kinds {', '.join(sorted(map(str, rows['kind'].unique())))}"])
    norm = norms(rows, kinds[0])
    what = "gradient" if kinds[0] in GRADIENT_KINDS else "activation"
    said = (f"{what} l2 ({kinds[0]}) of {norm.index[0]}: {norm.iloc[0]:.3g}" if len(norm) == 1 else
            f"{what} l2 ({kinds[0]}, {len(norm)} tensors): largest {norm.idxmax()} {norm.max():.3g}, "
            f"smallest {norm.idxmin()} {norm.min():.3g}")
    return Answer([said, _problems(rows)],
                  norm.rename("l2").rename_axis("label").reset_index())


def _problems(rows: pd.DataFrame) -> str:
    found = abnormal(rows)
    if found.empty:
        return "no dead or non-finite layer"
    parts = []
    for problem, group in found.groupby("problem", sort=False):
        names = [label_of(layer, kind, slot, 0) + ("" if kind in ("output", "param_grad") else f" {kind}")
                 for layer, kind, slot in zip(group["layer"], group["kind"], group["slot"])]
        parts.append(f"{problem}: {capped(list(dict.fromkeys(names)), MOST_NAMES)}")
    return "; ".join(parts)


def capped(names: list[str], most: int) -> str:
    """``names`` joined, the first ``most`` of them and how many more."""
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def percent(fraction: float) -> str:
    """A fraction as a percentage of one decimal (``<0.1%`` above 0, ``n/a`` for NaN)."""
    if np.isnan(fraction):
        return "n/a"
    if 0 < fraction < 0.001:
        return "<0.1%"
    return f"{100 * fraction:.1f}%"
