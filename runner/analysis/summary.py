"""What a run or a sweep recorded and did, in a few lines: the end of ``python -m runner`` and the head of the report.

A run gets one line for itself (steps, last losses) and one per hook entry: a ``clamp`` entry says
how many gradients and what fraction of their elements it clipped, per layer group (from its
``clipped`` rows: ``1 - zero_frac`` of each is the fraction clipped); any other entry that
recorded statistics names the layers with the largest and smallest gradient norm (the output
norm when it recorded no gradient) and the layers that look dead or non-finite
(``load.abnormal``). A run of several ranks counts each tensor once: the rows every rank records
alike (its part manifests' ``common.ranks.SAME_ON_EVERY_RANK``: all of them when every rank ran the
whole batch, as the CLI's FSDP2 run does; the whole-tensor rows of FSDP2's sharded gradients) are
read from the first rank only, and each rank's own rows (DDP: its batch) from every rank. A sweep
gets a table of the swept values against the last train loss and the headline statistic (the
fraction clipped, else the largest gradient norm), in job order: the order of the values on the
command line.
Every number is read back from the run's parquet files, the same ones the loaders give.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from common.ranks import SAME_ON_EVERY_RANK
from common.records import RUN_TOTAL_SCHEMAS

from runner.analysis.load import (GRADIENT_KINDS, abnormal, config_path, label_of, load_stats, load_steps,
                                  override_columns, run_dirs)
from runner.analysis.answers import answer_of
from runner.analysis.intact import read_manifest

#: The statistic columns the summary reads (a sweep is never read whole).
COLUMNS = ["step", "call", "hook", "layer", "phase", "kind", "slot", "numel", "l2", "zero_frac",
           "nan_count", "inf_count"]
#: The columns that name one tensor's row of a step (a rank records each once).
ROW_KEY = ["hook", "layer", "phase", "kind", "slot"]
#: Kinds whose norm a recording entry's line names, the first one the entry recorded.
NORM_KINDS = ("grad_output", "param_grad", "grad_input", "output", "input")
#: Rows of a sweep's table shown on the terminal (the report shows them all).
MOST_JOBS = 20
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
        return f"{self.elements:,} of {self.numel:,} elements ({_percent(self.fraction)})"


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


def entry_types(run_dir: Path) -> dict[str, str]:
    """``{entry name: hook type}`` from the run's saved config (empty when it has none)."""
    path = config_path(run_dir)
    hooks = (yaml.safe_load(path.read_text()) or {}).get("hooks") if path else None
    return {name: str((entry or {}).get("type", "?")) for name, entry in (hooks or {}).items()}


def summarize_run(run_dir: str | Path, on_corrupt: str = "error") -> list[str]:
    """The lines of one run: the run itself, then one or two per hook entry (``on_corrupt`` as for ``load_stats``)."""
    run_dir = Path(run_dir)
    steps = load_steps(run_dir, on_corrupt=on_corrupt)
    stats = once_per_tensor(load_stats(run_dir, columns=COLUMNS, on_corrupt=on_corrupt), run_dir)
    lines = [f"run {run_dir}: {_steps_line(steps)}"]
    totals = _run_total_rows(run_dir)
    for name, kind in entry_types(run_dir).items():
        rows = stats[(stats["hook"] == name) & (stats["phase"] != "eval")]
        named = name if kind == name else f"{name} ({kind})"
        answer = answer_of(run_dir, name, kind)
        own = answer.lines if answer is not None else \
            [line for line in _entry_lines(rows, kind) if not (totals.get(name) and line == "recorded nothing")]
        lines += [f"  {named}: {line}" if i == 0 else f"    {line}" for i, line in enumerate(own + totals.get(name, []))]
    return lines


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


def _run_total_rows(run_dir: Path) -> dict[str, list[str]]:
    """Per entry, a line per run-total file it wrote rows to (``units.parquet``, ``lens.parquet``, ...)."""
    out: dict[str, list[str]] = {}
    for name in RUN_TOTAL_SCHEMAS:
        if (run_dir / name).is_file():
            counts = pq.read_table(run_dir / name, columns=["hook"]).column("hook").value_counts().to_pylist()
            for count in counts:
                out.setdefault(count["values"], []).append(f"wrote {count['counts']} rows of {name}")
    return out


def _entry_lines(rows: pd.DataFrame, kind: str) -> list[str]:
    if rows.empty:
        return ["recorded nothing"]
    if kind == "clamp" and (rows["kind"] == "clipped").any():
        total = clipped(rows)
        depth = group_depth(rows["layer"].unique())
        groups = rows.assign(group=[layer_group(layer, depth) for layer in rows["layer"]])
        per_group = [f"{group} {_percent(clipped(part).fraction)}"  # gradients come last layer first
                     for group, part in groups.groupby("group", sort=False, observed=True)][::-1]
        return [f"clipped {total.gradients} of {total.of} gradients, {total}",
                "per layer group: " + _capped(per_group, 2 * MOST_NAMES)]
    kinds = [k for k in NORM_KINDS if (rows["kind"] == k).any()]
    if not kinds:
        return [f"{len(rows)} rows of kinds {', '.join(sorted(map(str, rows['kind'].unique())))}"]
    norm = norms(rows, kinds[0])
    what = "gradient" if kinds[0] in GRADIENT_KINDS else "activation"
    return [f"{what} l2 ({kinds[0]}, {len(norm)} tensors): largest {norm.idxmax()} {norm.max():.3g}, "
            f"smallest {norm.idxmin()} {norm.min():.3g}", _problems(rows)]


def _problems(rows: pd.DataFrame) -> str:
    found = abnormal(rows)
    if found.empty:
        return "no dead or non-finite layer"
    parts = []
    for problem, group in found.groupby("problem", sort=False):
        names = [label_of(layer, kind, slot, 0) + ("" if kind in ("output", "param_grad") else f" {kind}")
                 for layer, kind, slot in zip(group["layer"], group["kind"], group["slot"])]
        parts.append(f"{problem}: {_capped(list(dict.fromkeys(names)), MOST_NAMES)}")
    return "; ".join(parts)


def _steps_line(steps: pd.DataFrame) -> str:
    train = steps[steps["split"] == "train"] if "split" in steps.columns else steps
    evals = steps[steps["split"] == "eval"] if "split" in steps.columns else steps.iloc[:0]
    ranks = train["rank"].nunique() if "rank" in train.columns else 1  # a torchrun run: each rank's steps
    text = f"{len(train) // max(ranks, 1)} step(s){f' on {ranks} ranks' if ranks > 1 else ''}, " \
           f"last loss {_number(last_value(train, 'loss'))}"
    if not evals.empty:
        text += f", last eval loss {_number(last_value(evals, 'loss'))}"
    if "accuracy" in steps.columns and steps["accuracy"].notna().any():
        text += f", last {'eval' if not evals.empty else 'train'} accuracy " \
                f"{_number(last_value(evals if not evals.empty else train, 'accuracy'))}"
    return text


def sweep_table(path: str | Path, on_corrupt: str = "error") -> pd.DataFrame:
    """One row per job of the sweep at ``path``, in job order (the order of the swept values on the
    command line, ``runner.analysis.order``): the swept overrides, ``loss`` (the last train loss, when the jobs had one) and the headline statistic,
    ``clipped`` (fraction of gradient elements) when any job clipped, else ``largest KIND l2``.
    ``on_corrupt`` as for ``load_stats``."""
    steps = load_steps(path, columns=["step", "split", "loss"], on_corrupt=on_corrupt)
    stats = load_stats(path, columns=COLUMNS, on_corrupt=on_corrupt)
    stats = stats[stats["phase"] != "eval"]
    firsts = steps.drop_duplicates("run_dir").set_index("run_dir")
    swept = [c for c in override_columns(steps) if firsts[c].astype(str).nunique() > 1]
    runs = [str(run) for run in run_dirs(path, on_corrupt)]
    table = firsts.loc[runs, swept].reset_index(drop=True)
    by_run = steps[steps["split"] == "train"].groupby("run_dir", observed=True)["loss"].last()  # skips NaN
    if by_run.notna().any():  # loss=none: no column of NaN
        table["loss"] = by_run.reindex(runs).to_numpy()
    kinds = [k for k in NORM_KINDS if k in GRADIENT_KINDS and (stats["kind"] == k).any()]
    if (stats["kind"] == "clipped").any():
        rows = stats[stats["kind"] == "clipped"]
        elements = np.rint(rows["numel"] * (1 - rows["zero_frac"]))
        counts = rows[["run_dir"]].assign(numel=rows["numel"], elements=elements)
        sums = counts.groupby("run_dir", observed=True)[["elements", "numel"]].sum().reindex(runs)
        table["clipped"] = (sums["elements"] / sums["numel"]).to_numpy()
    elif kinds:
        rows = stats[stats["kind"] == kinds[0]]
        if kinds[0] == "param_grad" and (rows["phase"] == "after_backward").any():
            rows = rows[rows["phase"] == "after_backward"]
        per_tensor = rows.groupby(["run_dir", "layer", "slot", "call"], observed=True)["l2"].mean()
        largest = per_tensor.groupby(level="run_dir", observed=True).max()
        table[f"largest {kinds[0]} l2"] = largest.reindex(runs).to_numpy()
    return table


def summarize(path: str | Path, on_corrupt: str = "error") -> str:
    """The summary of the run or sweep at ``path`` and the command that writes its report
    (``on_corrupt`` as for ``load_stats``)."""
    path = Path(path)
    runs = run_dirs(path, on_corrupt)
    if len(runs) == 1 and runs[0] == path:
        lines = summarize_run(path, on_corrupt)
    else:
        table = sweep_table(path, on_corrupt)
        lines = [f"sweep {path}: {len(runs)} complete job(s)"]
        shown = table.head(MOST_JOBS)
        text = shown.to_string(index=False, formatters={"clipped": _percent}, float_format=lambda v: f"{v:.4g}")
        lines += ["  " + line for line in text.splitlines()]
        if len(table) > MOST_JOBS:
            lines.append(f"  ... and {len(table) - MOST_JOBS} more job(s): every job is in the report")
    lines.append(f"report: python -m runner.report {path}")
    return "\n".join(lines)


def _capped(names: list[str], most: int) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def last_value(frame: pd.DataFrame, column: str) -> float:
    """The last value of ``column`` that is not NaN (NaN when there is none)."""
    values = frame[column].dropna() if column in frame.columns else ()
    return float(values.iloc[-1]) if len(values) else float("nan")


def _number(value: float) -> str:
    return "none" if np.isnan(value) else f"{value:.4g}"


def _percent(fraction: float) -> str:
    if np.isnan(fraction):
        return "n/a"
    if 0 < fraction < 0.001:
        return "<0.1%"
    return f"{100 * fraction:.1f}%"
