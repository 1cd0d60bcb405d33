"""A patching sweep as one table: each job's metric, and the fraction of the clean-vs-corrupted gap it recovers.

A patching experiment is three things on disk: a clean run (which kept the layers' outputs), a
corrupted run (the same model on other data, no patch) and a sweep of ``hooks=patch`` jobs on the
corrupted data, one per layer and index; or, with ``hooks.patch.source=clean``, the sweep alone,
each job holding its clean and corrupted metric beside its own (``clean_*``, ``corrupted_*``).
``recovered = (patched - corrupted) / (clean - corrupted)``: 0 where patching changed nothing, 1
where it restored the clean metric. Metrics are the mean over each run's training steps.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from runner.analysis.load import load_steps
from runner.analysis.order import natural_key

#: The sweep's override columns naming what each job patched.
LAYER, INDEX = "hooks.patch.layers", "hooks.patch.index"
#: ``hooks.patch.source`` of jobs patched from their own clean pass (``hooks.interventions.CLEAN``;
#: not imported from there, which would make reading a sweep import torch).
CLEAN = "clean"


def mean_metric(path: str | Path, metric: str) -> float:
    """The mean of ``metric`` over the training steps of the run at ``path``."""
    steps = load_steps(path)
    values = steps.loc[steps["split"] == "train", metric]
    if values.isna().all():
        raise ValueError(f"run '{path}' has no {metric} in steps.parquet; set metric.target or metric.diff")
    return float(values.mean())


def patching_table(sweep: str | Path, clean: str | Path | None = None, corrupted: str | Path | None = None,
                   metric: str = "logit_diff") -> pd.DataFrame:
    """One row per patching job, in layer and index order (``h.2`` before ``h.10``): ``layer``, ``index`` (what it patched; ``"all"`` without an index),
    ``patched``, ``clean``, ``corrupted`` (the metric's means) and ``recovered``. Without ``clean``
    and ``corrupted`` runs, each job's own clean and corrupted passes (``source: clean``)."""
    if (clean is None) != (corrupted is None):
        raise ValueError("give both the clean and the corrupted run, or neither (jobs patched from their own clean pass)")
    steps = load_steps(sweep)
    if LAYER not in steps.columns:
        raise ValueError(f"'{sweep}' is not a patching sweep: its jobs do not override {LAYER}")
    train = steps[steps["split"] == "train"].copy()
    if INDEX not in train.columns:
        train["index"] = "all"
    else:  # channel or position numbers stay numbers (sorted as such); slices are text
        train["index"] = train[INDEX] if pd.api.types.is_numeric_dtype(train[INDEX]) else train[INDEX].astype(str)
    beside = [f"clean_{metric}", f"corrupted_{metric}"]
    if clean is None and (not set(beside) <= set(train.columns) or train[beside].isna().any().any()):
        raise ValueError(f"'{sweep}' has no {beside[0]} in every job's steps: give the clean and corrupted runs, "
                         f"or patch from each job's own clean pass (hooks.patch.source=clean)")
    means = [metric] + (beside if clean is None else [])
    table = (train.groupby([LAYER, "index"], observed=True, sort=False)[means].mean().reset_index()
             .rename(columns={LAYER: "layer", metric: "patched", beside[0]: "clean", beside[1]: "corrupted"}))
    table["layer"] = table["layer"].astype(str)
    table = table.sort_values(["layer", "index"], key=lambda column: column.map(natural_key), ignore_index=True)
    if clean is not None:
        table["clean"], table["corrupted"] = mean_metric(clean, metric), mean_metric(corrupted, metric)
    if (table["clean"] == table["corrupted"]).any():
        raise ValueError(f"clean and corrupted runs have the same {metric} ({table['clean'].iloc[0]}): nothing to recover")
    table["recovered"] = (table["patched"] - table["corrupted"]) / (table["clean"] - table["corrupted"])
    table.attrs["metric"] = metric
    return table
