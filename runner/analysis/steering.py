"""A steering sweep as one table: per job, what it added where, how far it moved the next-token
distribution (``kl``: the mean of ``steer.parquet``'s KL(unsteered || steered)) and the metric with and
without the vector (the step rows' metric and its ``corrupted_*`` column, the unsteered pass beside each step).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.records import STEER
from runner.analysis.load import load_steps, load_table, override_columns
from runner.analysis.order import natural_key


def steering_table(path: str | Path, metric: str = "logit_diff") -> pd.DataFrame:
    """One row per steering job (and entry) at or under ``path``: ``method`` (``steer``), ``hook``,
    ``layers``, ``scale``, the job's overrides, ``kl`` and, when the runs measured ``metric``,
    ``steered`` and ``unsteered`` (its means over the training steps). Ordered by layer, then scale."""
    rows = load_table(path, STEER)
    if rows.empty:
        raise ValueError(f"no run at or under '{path}' wrote {STEER} (a steer entry with baseline=true)")
    rows["layers"] = rows["layers"].map(",".join)
    keys = ["run_dir", "hook", "method", "layers", "scale", *override_columns(rows)]
    table = rows.groupby(keys, observed=True, dropna=False)["kl"].mean().reset_index()
    steps = load_steps(path)
    train = steps[steps["split"] == "train"]
    measured = [metric, f"corrupted_{metric}"]
    if set(measured) <= set(train.columns) and not train[measured].isna().all().any():
        means = train.groupby("run_dir", observed=True)[measured].mean()
        means.columns = ["steered", "unsteered"]
        table = table.join(means, on="run_dir")
    table = table.sort_values(["layers", "scale"], key=lambda c: c.map(natural_key) if c.name == "layers" else c,
                              ignore_index=True)
    table.attrs["metric"] = metric
    return table
