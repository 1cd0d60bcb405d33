"""A steering sweep as one table: per job, what it added where, how far it moved the next-token
distribution (``kl``: the mean of ``steer.parquet``'s KL(unsteered || steered); ``top_changed``: how often
the top next token differs) and the metric with and
without the vector (the step rows' metric and its ``corrupted_*`` column, the unsteered pass beside each step);
``steering_picture`` draws both against the scale, a line per steered layer.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from common.records import STEER
from runner.analysis.load import load_steps, load_table, override_columns
from runner.analysis.order import natural_key


def steering_table(path: str | Path, metric: str = "logit_diff", steps: pd.DataFrame | None = None,
                   on_corrupt: str = "error") -> pd.DataFrame:
    """One row per steering job (and entry) at or under ``path``: ``method`` (``steer``), ``hook``,
    ``layers``, ``scale``, the job's overrides, ``kl``, ``top_changed`` (the fraction of samples and steps
    whose top next token the vector changed) and, when the runs measured ``metric``,
    ``steered`` and ``unsteered`` (its means over the training steps). Ordered by layer, then scale.
    ``runner.analysis.patching.patching_table`` shows the same jobs beside the patching rows. ``steps``
    (their ``load_steps``, when read already) and ``on_corrupt`` as for ``steer_jobs``."""
    table = steer_jobs(path, metric, steps, on_corrupt)
    if table.empty:
        raise ValueError(f"no run at or under '{path}' wrote {STEER} (a steer entry with baseline=true)")
    table = table.sort_values(["layers", "scale"], key=lambda c: c.map(natural_key) if c.name == "layers" else c,
                              ignore_index=True)
    table.attrs["metric"] = metric
    return table


def steer_jobs(path: str | Path, metric: str, steps: pd.DataFrame | None = None,
               on_corrupt: str = "error") -> pd.DataFrame:
    """The steering jobs at or under ``path`` (empty where none wrote ``steer.parquet``), one row per job and
    entry: ``run_dir``, ``hook``, ``method``, ``layers``, ``scale``, the overrides, ``kl``, ``top_changed`` and, when measured,
    ``steered`` and ``unsteered``. ``steps``: the runs' step rows, when the caller has them already;
    ``on_corrupt`` as for ``load_stats``."""
    rows = load_table(path, STEER, on_corrupt=on_corrupt)
    if rows.empty:
        return rows
    rows["layers"] = rows["layers"].map(",".join)
    rows["top_changed"] = [steered[0] != unsteered[0] for steered, unsteered in
                           zip(rows["steered_top_ids"], rows["unsteered_top_ids"])]
    keys = ["run_dir", "hook", "method", "layers", "scale", *override_columns(rows)]
    table = rows.groupby(keys, observed=True, dropna=False)[["kl", "top_changed"]].mean().reset_index()
    steps = load_steps(path, on_corrupt=on_corrupt) if steps is None else steps
    train = steps[steps["split"] == "train"]
    measured = [metric, f"corrupted_{metric}"]
    if set(measured) <= set(train.columns) and not train[measured].isna().all().any():
        means = train.groupby("run_dir", observed=True)[measured].mean()
        means.columns = ["steered", "unsteered"]
        table = table.join(means, on="run_dir")
    return table


def steering_picture(table: pd.DataFrame, title: str = "") -> Figure:
    """Per steered layer (one line each) against ``scale``: the mean KL(unsteered || steered) of the
    next-token distribution and, when measured, the metric steered (the unsteered one dashed)."""
    measured = "steered" in table.columns
    fig = Figure(figsize=(5.0 * (1 + measured), 3.6), layout="constrained")
    axes = fig.subplots(1, 1 + measured, squeeze=False)[0]
    for layers, rows in table.groupby("layers", sort=False):
        rows = rows.sort_values("scale")
        line = axes[0].plot(rows["scale"], rows["kl"], marker="o", label=layers)[0]
        if measured:
            axes[1].plot(rows["scale"], rows["steered"], marker="o", color=line.get_color(), label=layers)
            axes[1].plot(rows["scale"], rows["unsteered"], linestyle="--", color=line.get_color(), linewidth=0.8)
    axes[0].set_ylabel("KL(unsteered || steered), nats")
    if measured:
        axes[1].set_ylabel(f"{table.attrs.get('metric', 'metric')} (dashed: unsteered)")
    for ax in axes:
        ax.set_xlabel("scale")
        ax.legend(title="steered layer", fontsize="small")
    fig.suptitle(title or "steering: next-token KL and metric against the scale")
    return fig
