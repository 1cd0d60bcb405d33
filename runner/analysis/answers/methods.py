"""The answers of patching, attribution and steering: what a patch, an estimate or a vector did to
the metric (``logit_diff`` when the runs measured it, else ``logit``).

Patching (``patch``, a path patch too) and attribution say the clean and corrupted metric and the
cells that recover most of the gap between them, with their recovered fraction
(``runner.analysis.patching.patching_table``); attribution beside real patching says how well the
estimate agrees (``attribution_against_patching``). Steering says, per steered layer and scale, the
KL(unsteered || steered) of the next-token distribution and how often the top token changed
(``runner.analysis.steering.steering_table``). A patching job answers for itself (``patch_answer``); an
attribution or steering run, a sweep, or a directory of such runs answers with ``methods_answer``
(the sweep answerer of every type here).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common.records import METHOD
from runner.analysis.answers import Answer
from runner.analysis.load import load_steps
from runner.analysis.numbers import plain
from runner.analysis.patching import (CLEAN, ESTIMATE, PATCH, PATH, STEERING, attribution_against_patching,
                                      job_patching_table, patching_table)
from runner.analysis.steering import steering_table

#: Cells named per method: those that recover most.
MOST_CELLS = 5
#: What each method's line calls itself.
NAMES = {PATCH: "activation patching", PATH: "path patching", ESTIMATE: "attribution estimate"}


def measured_metric(steps: pd.DataFrame) -> str | None:
    """``logit_diff`` when the runs measured it, else ``logit``, else ``None``."""
    for metric in ("logit_diff", "logit"):
        if metric in steps.columns and steps[metric].notna().any():
            return metric
    return None


def patch_answer(run_dir: Path, entry: str) -> Answer | None:
    """One patching job: the metric patched, and clean and corrupted (its own passes beside each step,
    ``source: clean``; or the stored clean run's) with the fraction recovered (``job_patching_table``)."""
    metric = measured_metric(load_steps(run_dir).query("split == 'train'"))
    if metric is None:
        return None
    table = job_patching_table(run_dir, entry, metric)
    row = next(table.itertuples())
    gap = f", corrupted {row.corrupted:.4g}: recovered {fraction(row.recovered)}" if not np.isnan(row.corrupted) else \
        " (the corrupted run's is not known to a patching job: patching_table(..., corrupted=RUN))"
    return Answer([f"{metric} patched at {cell_name(row)} {row.patched:.4g}; clean {row.clean:.4g}{gap}"],
                  table.dropna(axis=1, how="all"))


def methods_answer(path: Path, entry: str, corrupted: str | Path | None = None, on_corrupt: str = "error"
                   ) -> Answer | None:
    """Of the patching, attribution and steering runs at or under ``path`` (``corrupted``: the baseline
    run of a sweep patched from a stored clean run, for its recovered fractions): a paragraph per
    method; the table is ``patching_table``'s without the columns no row fills (of steering alone,
    ``steering_table``: it has ``top_changed``). ``on_corrupt`` as for ``load_stats``."""
    steps = load_steps(path, on_corrupt=on_corrupt)
    metric = measured_metric(steps)
    if metric is None:
        return None
    sources = steps["hooks.patch.source"].dropna().astype(str).unique() if "hooks.patch.source" in steps else []
    clean = sources[0] if len(sources) == 1 and sources[0] != CLEAN else None
    try:
        table = patching_table(path, clean, corrupted if clean else None, metric, on_corrupt)
    except ValueError as exc:  # what the runs cannot answer (clean and corrupted alike: nothing to recover), said
        return Answer([str(exc)])
    lines = []
    for method, name in NAMES.items():
        rows = table[table[METHOD] == method]
        if len(rows):
            lines += _recovery_lines(name, rows, metric, path)
    if {PATCH, ESTIMATE} <= set(table[METHOD]):
        both, r = attribution_against_patching(table)
        lines.append(f"estimate against real patching: r = {r:.3f} over {len(both)} cells")
    if (table[METHOD] == STEERING).any():
        steer = steering_table(path, metric, steps, on_corrupt)
        lines += _steer_lines(steer, metric)
        if (table[METHOD] == STEERING).all():
            return Answer(lines, steer)
    return Answer(lines, table.dropna(axis=1, how="all"))


def cell_name(row) -> str:
    """A patching cell as the lines name it: ``layer [index]``, a path's ``sender → receiver [index]``."""
    receiver = f" → {row.receiver}" if isinstance(getattr(row, "receiver", None), str) else ""
    return f"{row.layer}{receiver} [{row.index}]"


def fraction(value: float) -> str:
    """A recovered fraction to 2 decimals, never ``-0.00``."""
    return f"{round(value, 2) + 0.0:.2f}"


def _recovery_lines(name: str, rows: pd.DataFrame, metric: str, path: Path) -> list[str]:
    clean, corrupted = rows["clean"].mean(), rows["corrupted"].mean()
    if np.isnan(corrupted):  # a sweep from a stored clean run, without its corrupted run
        closest = rows.assign(gap=(rows["patched"] - clean).abs()).nsmallest(MOST_CELLS, "gap")
        return [f"{name} of {metric}: clean {clean:.4g} (the recovered fraction needs the corrupted run: "
                f"python -m runner.report {path} --corrupted RUN)",
                f"closest to clean, of {len(rows)} cells: "
                + ", ".join(f"{cell_name(row)} {row.patched:.4g}" for row in closest.itertuples())]
    top = rows.nlargest(MOST_CELLS, "recovered")
    return [f"{name} of {metric}: clean {clean:.4g}, corrupted {corrupted:.4g}",
            f"recovers most, of {len(rows)} cells: "
            + ", ".join(f"{cell_name(row)} {fraction(row.recovered)}" for row in top.itertuples())]


def _steer_lines(steer: pd.DataFrame, metric: str) -> list[str]:
    """A line per steered layer and scale: the KL, how often the top token changed, the metric steered (unsteered)."""
    measured = "steered" in steer
    lines = ["steering, per layer and scale: KL(unsteered || steered) of the next token, how often its top token "
             "changed" + (f", {metric} steered (unsteered)" if measured else "")]
    for row in steer.itertuples():
        lines.append(f"{row.layers} scale {plain(row.scale, 'g')}: KL {row.kl:.3g}, top token changed {100 * row.top_changed:.0f}%"
                     + (f", {row.steered:.4g} ({row.unsteered:.4g})" if measured else ""))
    return lines
