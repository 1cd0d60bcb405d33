"""A patching sweep as one table: each job's metric, and the fraction of the clean-vs-corrupted gap it recovers.

A patching experiment is three things on disk: a clean run (which kept the layers' outputs), a
corrupted run (the same model on other data, no patch) and a sweep of ``hooks=patch`` jobs on the
corrupted data, one per layer and index. ``recovered = (patched - corrupted) / (clean - corrupted)``:
0 where patching changed nothing, 1 where it restored the clean metric. Metrics are the mean over
each run's training steps.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from runner.analysis.load import load_steps

#: The sweep's override columns naming what each job patched.
LAYER, INDEX = "hooks.patch.layers", "hooks.patch.index"


def mean_metric(path: str | Path, metric: str) -> float:
    """The mean of ``metric`` over the training steps of the run at ``path``."""
    steps = load_steps(path)
    values = steps.loc[steps["split"] == "train", metric]
    if values.isna().all():
        raise ValueError(f"run '{path}' has no {metric} in steps.parquet; set metric.target or metric.diff")
    return float(values.mean())


def recovered_fraction(patched, clean: float, corrupted: float):
    """``(patched - corrupted) / (clean - corrupted)``; the clean and corrupted metric must differ."""
    if clean == corrupted:
        raise ValueError(f"clean and corrupted runs have the same metric ({clean}): nothing to recover")
    return (patched - corrupted) / (clean - corrupted)


def patching_table(sweep: str | Path, clean: str | Path, corrupted: str | Path,
                   metric: str = "logit_diff") -> pd.DataFrame:
    """One row per patching job: ``layer``, ``index`` (what it patched; ``"all"`` without an index),
    ``patched``, ``clean``, ``corrupted`` (the metric's means) and ``recovered``."""
    steps = load_steps(sweep)
    if LAYER not in steps.columns:
        raise ValueError(f"'{sweep}' is not a patching sweep: its jobs do not override {LAYER}")
    train = steps[steps["split"] == "train"].copy()
    if INDEX not in train.columns:
        train["index"] = "all"
    else:  # channel or position numbers stay numbers (sorted as such); slices are text
        train["index"] = train[INDEX] if pd.api.types.is_numeric_dtype(train[INDEX]) else train[INDEX].astype(str)
    table = (train.groupby([LAYER, "index"], observed=True, sort=False)[metric].mean().reset_index()
             .rename(columns={LAYER: "layer", metric: "patched"}))
    table["layer"] = table["layer"].astype(str)
    table["clean"], table["corrupted"] = mean_metric(clean, metric), mean_metric(corrupted, metric)
    table["recovered"] = recovered_fraction(table["patched"], table["clean"].iloc[0], table["corrupted"].iloc[0])
    table.attrs["metric"] = metric
    return table
