"""Patching results as one table: each job's metric, each attribution estimate, and the fraction of
the clean-vs-corrupted gap each recovers.

A patching experiment is three things on disk: a clean run (which kept the layers' outputs), a
corrupted run (the same model on other data, no patch) and a sweep of ``hooks=patch`` jobs on the
corrupted data, one per layer and index; or, with ``hooks.patch.source=clean``, the sweep alone,
each job holding its clean and corrupted metric beside its own (``clean_*``, ``corrupted_*``).
A job whose patch has a ``receiver`` patched a path (method ``path``: what its layer sends the
receiver). An attribution run (``hooks=attribution``) holds every layer and index of its entry at
once, as kept tensors of kind ``attribution`` (method ``attribution``: ``patched`` is the corrupted
metric plus the estimate). A steering job (``hooks=steer``, ``steer.parquet``) adds ``scale`` times a
vector instead (method ``steer``): ``patched`` is the steered metric, ``corrupted`` the unsteered pass's
beside each step, ``kl`` the mean KL(unsteered || steered) of the next-token distribution; it has no clean
run, so no ``clean`` and no ``recovered``. ``recovered = (patched - corrupted) / (clean - corrupted)``: 0
where patching changed nothing, 1 where it restored the clean metric. Metrics are the mean over each
run's training steps. The columns are ``common.records.PATCHING_COLUMNS``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from common.records import METHOD, METHODS, PATCHING_COLUMNS, STEER
from common.run_config import saved_config_path
from runner.analysis.load import load_steps, load_tensors
from runner.analysis.order import natural_key
from runner.analysis.steering import steer_jobs

#: The sweep's override columns naming what each job patched (``RECEIVER``: a path's receiver).
LAYER, INDEX, RECEIVER = "hooks.patch.layers", "hooks.patch.index", "hooks.patch.receiver"
#: ``hooks.patch.source`` of jobs patched from their own clean pass (``hooks.types.interventions.CLEAN``;
#: not imported from there, which would make reading a sweep import torch).
CLEAN = "clean"
#: The kind of an attribution entry's estimates (``hooks.types.attribution``).
ATTRIBUTION = "attribution"


def mean_metric(path: str | Path, metric: str) -> float:
    """The mean of ``metric`` over the training steps of the run at ``path``."""
    steps = load_steps(path)
    values = steps.loc[steps["split"] == "train", metric]
    if values.isna().all():
        raise ValueError(f"run '{path}' has no {metric} in steps.parquet; set metric.target or metric.diff")
    return float(values.mean())


def patching_table(sweep: str | Path | Sequence[str | Path], clean: str | Path | None = None,
                   corrupted: str | Path | None = None, metric: str = "logit_diff", on_corrupt: str = "error"
                   ) -> pd.DataFrame:
    """One row per method, layer (and receiver), index and scale, in that order (``h.2`` before ``h.10``):
    ``method`` (``patch``, ``attribution``, ``path``, ``steer``), ``layer`` (a steer job's layers, joined
    by commas), ``receiver`` (a path's; else missing), ``index`` (what was patched or steered; ``"all"``
    without an index), ``scale`` (a steer job's; else missing), ``patched``, ``clean``, ``corrupted`` (the
    metric's means), ``recovered`` and ``kl`` (a steer job's).

    ``sweep`` is a patching sweep, an attribution run, a steering sweep, a directory above them, or a list
    of them (one table). ``clean`` and ``corrupted`` are the stored runs of a sweep patched from a stored
    run (the clean one alone: ``corrupted`` and ``recovered`` missing); without them, each job's own clean
    and corrupted passes (``source: clean``; always so for attribution). ``on_corrupt`` (as for
    ``load_stats``) applies to ``sweep``."""
    if clean is None and corrupted is not None:
        raise ValueError("give the clean run with the corrupted one (or neither: jobs patched from their own clean pass)")
    paths = [sweep] if isinstance(sweep, (str, Path)) else list(sweep)
    parts = [part for path in paths for part in _rows(path, clean, corrupted, metric, on_corrupt)]
    table = pd.concat([part.reindex(columns=PATCHING_COLUMNS) for part in parts], ignore_index=True)
    table = table.astype({"layer": str, "scale": float, "patched": float, "clean": float, "corrupted": float,
                          "kl": float})
    order = {method: i for i, method in enumerate(METHODS)}
    cell = [METHOD, "layer", "receiver", "index", "scale"]
    table = table.sort_values(cell, ignore_index=True, key=lambda c: (
        c.map(order) if c.name == METHOD else c if c.name == "scale" else c.map(natural_key)))
    twice = table[table.duplicated(cell, keep=False)]
    if len(twice):
        raise ValueError(f"two results for {dict(twice.iloc[0][cell].dropna())}: load those runs apart")
    if (table["clean"] == table["corrupted"]).any():
        raise ValueError(f"clean and corrupted runs have the same {metric} ({table['clean'].iloc[0]}): nothing to recover")
    return _recovered(table, metric)


def job_patching_table(run_dir: str | Path, entry: str, metric: str = "logit_diff") -> pd.DataFrame:
    """``patching_table``'s row of one patching job (entry ``entry`` of the run at ``run_dir``), its cell
    (layer, receiver, index) and source from its saved config, so a run that named them in no override has
    one too; patched from a stored clean run, its ``corrupted`` and ``recovered`` are missing (NaN)."""
    spec = OmegaConf.load(saved_config_path(run_dir)).hooks[entry]
    cell = {LAYER: str(spec.layers), RECEIVER: spec.get("receiver")}
    if spec.get("index") is not None:
        cell[INDEX] = spec.index
    source = str(spec.source)
    rows = _patch_rows(run_dir, load_steps(run_dir).assign(**cell), None if source == CLEAN else source, None, metric)
    return _recovered(rows.reindex(columns=PATCHING_COLUMNS), metric)


def _recovered(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``table`` with its ``recovered`` fraction of the clean-vs-corrupted gap, and ``metric`` in its attrs."""
    table["recovered"] = (table["patched"] - table["corrupted"]) / (table["clean"] - table["corrupted"])
    table.attrs["metric"] = metric
    return table


def _rows(path: str | Path, clean, corrupted, metric: str, on_corrupt: str) -> list[pd.DataFrame]:
    """The rows of the patching jobs, the attribution runs and the steering jobs at or under ``path``."""
    steps = load_steps(path, on_corrupt=on_corrupt)
    estimates = load_tensors(path, filters=[("kind", "=", ATTRIBUTION)], on_corrupt=on_corrupt)
    steered = steer_jobs(path, metric, steps, on_corrupt)
    if LAYER not in steps.columns and estimates.empty and steered.empty:
        raise ValueError(f"'{path}' is neither a patching sweep (its jobs do not override {LAYER}) nor an "
                         f"attribution run (no kind '{ATTRIBUTION}' kept: hooks=attribution) nor a steering run "
                         f"(no {STEER}: hooks=steer)")
    parts = [] if estimates.empty else [_attribution_rows(estimates, steps, metric)]
    if LAYER in steps.columns:
        parts.append(_patch_rows(path, steps[steps[LAYER].notna()], clean, corrupted, metric))
    if not steered.empty:
        parts.append(_steer_rows(path, steered, metric))
    return parts


def _steer_rows(path: str | Path, jobs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per steering job and entry (``runner.analysis.steering.steer_jobs``): the metric steered
    (``patched``) and unsteered (``corrupted``), ``scale``, ``kl`` and the entry's ``index``."""
    if "steered" not in jobs.columns or jobs[["steered", "unsteered"]].isna().any().any():
        raise ValueError(f"the steering runs at or under '{path}' have no {metric} and corrupted_{metric} in every "
                         f"step: set metric.target or metric.diff")
    return pd.DataFrame({METHOD: "steer", "layer": jobs["layers"], "receiver": None,
                         "index": [_entry_index(run_dir, hook) for run_dir, hook in zip(jobs["run_dir"], jobs["hook"])],
                         "scale": jobs["scale"], "patched": jobs["steered"], "clean": np.nan,
                         "corrupted": jobs["unsteered"], "kl": jobs["kl"]})


def _entry_index(run_dir: str, hook: str) -> int | str:
    """The ``index`` of entry ``hook`` in the run's saved config (``"all"`` without one)."""
    path = saved_config_path(run_dir)
    index = OmegaConf.load(path).get("hooks", {}).get(hook, {}).get("index") if path is not None else None
    return "all" if index is None else index if isinstance(index, int) else str(index)


def _patch_rows(sweep: str | Path, steps: pd.DataFrame, clean, corrupted, metric: str) -> pd.DataFrame:
    """One row per patching job (layer, receiver, index): the mean of its metric; method ``path``
    where the job's patch has a receiver, else ``patch`` (also for runs stored before receivers)."""
    train = steps[steps["split"] == "train"].copy()
    if INDEX not in train.columns:
        train["index"] = "all"
    elif pd.api.types.is_numeric_dtype(train[INDEX]):  # channel or position numbers stay integers (sorted as such),
        train["index"] = train[INDEX].astype("int64")    # also where other runs of the directory had none (NaN)
    else:  # slices are text
        train["index"] = train[INDEX].astype(str)
    train["receiver"] = train[RECEIVER].astype(object) if RECEIVER in train.columns else None
    train["receiver"] = train["receiver"].where(train["receiver"].notna(), "")
    beside = [f"clean_{metric}", f"corrupted_{metric}"]
    if clean is None and (not set(beside) <= set(train.columns) or train[beside].isna().any().any()):
        raise ValueError(f"'{sweep}' has no {beside[0]} in every job's steps: give the clean and corrupted runs, "
                         f"or patch from each job's own clean pass (hooks.patch.source=clean)")
    means = [metric] + (beside if clean is None else [])
    table = (train.groupby([LAYER, "receiver", "index"], observed=True, sort=False)[means].mean().reset_index()
             .rename(columns={LAYER: "layer", metric: "patched", beside[0]: "clean", beside[1]: "corrupted"}))
    table[METHOD] = np.where(table["receiver"] == "", "patch", "path")
    table["receiver"] = table["receiver"].replace("", None)
    if clean is not None:
        table["clean"] = mean_metric(clean, metric)
        table["corrupted"] = mean_metric(corrupted, metric) if corrupted is not None else np.nan
    return table


def _attribution_rows(estimates: pd.DataFrame, steps: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per layer and index of each attribution run: the corrupted metric plus the estimate
    (summed over a layer's calls, as a patch patches every call; the mean over the steps)."""
    rows = []
    for run_dir, kept in estimates.groupby("run_dir", observed=True):
        _check_estimated(run_dir, set(kept["hook"]), metric)
        train = steps[(steps["run_dir"] == run_dir) & (steps["split"] == "train")]
        sides = {side: float(train[f"{side}_{metric}"].mean()) for side in ("clean", "corrupted")}
        per_step = kept.groupby(["layer", "step"], observed=True)["tensor"].apply(lambda t: np.sum(list(t), axis=0))
        for layer, values in per_step.groupby(level="layer", observed=True):
            mean = np.mean(np.stack(list(values)), axis=0)
            rows += [{METHOD: ATTRIBUTION, "layer": layer, "receiver": None, "index": i,
                      "patched": sides["corrupted"] + float(value), **sides} for i, value in enumerate(mean)]
    return pd.DataFrame(rows)


def _check_estimated(run_dir: str, hooks: set[str], metric: str) -> None:
    """The attribution entries of ``run_dir`` estimate ``metric`` (their ``metric`` key)."""
    path = saved_config_path(run_dir)
    entries = OmegaConf.load(path).get("hooks", {}) if path is not None else {}
    for hook in hooks:
        estimated = entries.get(hook, {}).get("metric", "logit_diff")
        if estimated != metric:
            raise ValueError(f"run '{run_dir}' estimates {estimated} (hooks.{hook}.metric), not {metric}")


def attribution_against_patching(table: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """The cells both an attribution run and real patching hold (``attribution`` and ``patch``
    columns: their recovered fractions, by layer and index) and the Pearson correlation between them
    (NaN with fewer than 2 cells or no variation)."""
    cell = ["layer", "index"]
    wide = {method: table[table[METHOD] == method].set_index(cell)["recovered"] for method in ("attribution", "patch")}
    both = pd.concat(wide, axis=1, join="inner").reset_index()
    ok = len(both) > 1 and both["attribution"].std() > 0 and both["patch"].std() > 0
    return both, float(np.corrcoef(both["attribution"], both["patch"])[0, 1]) if ok else float("nan")
