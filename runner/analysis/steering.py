"""A steering sweep as one table: per job, what it added where, how far it moved the next-token
distribution (``kl``: the mean of ``steer.parquet``'s KL(unsteered || steered); ``top_changed``: how often
the top next token differs) and the metric with and
without the vector (the step rows' metric and its ``corrupted_*`` column, the unsteered pass beside each step);
``steering_picture`` draws the three against the scale, a line per steered layer, in the order the
run's answer says them (``runner.analysis.answers.methods``).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from common.records import STEER
from runner.analysis.load import load_steps, load_table, override_columns

#: Each steered layer's marker (each smaller, drawn over the ones before): lines of equal values stay visible.
MARKERS = ["o", "s", "^", "D", "v", "P"]


def steering_table(path: str | Path, metric: str = "logit_diff", steps: pd.DataFrame | None = None,
                   on_corrupt: str = "error") -> pd.DataFrame:
    """One row per steering job (and entry) at or under ``path``: ``method`` (``steer``), ``hook``,
    ``layers``, ``scale``, the job's overrides, ``kl``, ``top_changed`` (the fraction of samples and steps
    whose top next token the vector changed) and, when the runs measured ``metric``,
    ``steered`` and ``unsteered`` (its means over the training steps). Ordered by layer, then scale, each as
    the command line wrote them (their jobs' order).
    ``runner.analysis.patching.patching_table`` shows the same jobs beside the patching rows. ``steps``
    (their ``load_steps``, when read already) and ``on_corrupt`` as for ``steer_jobs``."""
    table = steer_jobs(path, metric, steps, on_corrupt)
    if table.empty:
        raise ValueError(f"no run at or under '{path}' wrote {STEER} (a steer entry with baseline=true)")
    # Job order is the command line's (``runner.analysis.order``): each layer and scale in the place its
    # first job has, so ``layers=h.1,h.0 scale=40,0,5`` reads h.1 first and 40 before 0, as written.
    table = table.sort_values(["layers", "scale"], key=lambda c: pd.Series(pd.factorize(c)[0], index=c.index),
                              kind="stable", ignore_index=True)
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
    rows["layers"] = pc.binary_join(pa.array(rows["layers"], type=pa.list_(pa.string())), ",").to_numpy(
        zero_copy_only=False)
    rows["top_changed"] = pc.not_equal(_top_id(rows["steered_top_ids"]), _top_id(rows["unsteered_top_ids"])
                                       ).to_numpy(zero_copy_only=False)
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


def _top_id(lists: pd.Series) -> pa.Array:
    """The first (top) id of each row's list of top token ids."""
    return pc.list_element(pa.array(lists, type=pa.list_(pa.int64())), 0)


def steering_picture(table: pd.DataFrame, title: str = "") -> Figure:
    """``steering_table``'s rows against ``scale``, one colour (and marker: equal values stay visible) per
    steered layer, as the answer says them: the mean KL(unsteered || steered) of the next-token distribution,
    how often the top next token changed, and, when measured, the metric steered (solid) and unsteered (dashed).
    One legend under the panels explains every colour and line."""
    measured = "steered" in table.columns
    metric = table.attrs.get("metric", "metric")
    fig = Figure(figsize=(4.3 * (2 + measured), 3.9), layout="constrained")
    axes = fig.subplots(1, 2 + measured, squeeze=False)[0]
    handles = []
    for i, (layers, rows) in enumerate(table.groupby("layers", sort=False)):
        rows = rows.sort_values("scale")
        style = dict(marker=MARKERS[i % len(MARKERS)], markersize=max(11 - 3 * i, 4))
        handles.append(axes[0].plot(rows["scale"], rows["kl"], label=f"steered layer {layers}", **style)[0])
        colour = handles[-1].get_color()
        axes[1].plot(rows["scale"], 100 * rows["top_changed"], color=colour, **style)
        if measured:
            axes[2].plot(rows["scale"], rows["steered"], color=colour, **style)
            axes[2].plot(rows["scale"], rows["unsteered"], linestyle="--", color=colour, linewidth=0.8)
    axes[0].set(title="KL(unsteered || steered), next token", ylabel="KL, nats")
    axes[1].set(title="top next token changed", ylabel="% of samples and steps", ylim=(-5, 105))
    if measured:
        axes[2].set(title=f"{metric}, steered and unsteered", ylabel=metric)
        handles += [Line2D([], [], color="grey", label=f"{metric} steered"),
                    Line2D([], [], color="grey", linestyle="--", linewidth=0.8, label=f"{metric} unsteered")]
    for ax in axes:
        ax.set_xlabel("scale (times the vector)")
        ax.set_xticks(sorted(table["scale"].dropna().unique()))  # a NaN tick fails matplotlib's formatter
        ax.grid(True, alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize="small")
    fig.suptitle(title or f"steering, per steered layer ({table['layers'].nunique()}) and scale "
                 f"({', '.join(f'{s:g}' for s in sorted(table['scale'].unique()))})")
    return fig
