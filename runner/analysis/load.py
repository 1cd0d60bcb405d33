"""Load runs and sweeps into tidy pandas DataFrames.

A run directory is one that holds ``manifest.json`` (written last, so only complete runs are
read); a sweep directory is searched for run directories at any depth. Every row carries the
``run_dir`` it came from and one column per Hydra override of its job (``model``, ``hooks``,
``hooks.clip.max``), so a sweep is one table to group by. Each file is read on its own and the
frames are concatenated, so a column that only some jobs wrote is kept (NaN in the rows of the
others); pyarrow's dataset readers would take the first file's schema and drop it. Values are
converted from Arrow to numpy directly, so a NaN stays a NaN.

Example:
    >>> df = load_stats("outputs/multirun/2026-11-22/10-00-00")
    >>> df[df.kind == "param_grad"].groupby(["hooks.clip.max", "layer"]).l2.max()
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.store.outputs import MANIFEST

# numpy has no bfloat16: such tensors come back as float32.
_NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int64": np.int64,
                 "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def run_dirs(path: str | Path) -> list[Path]:
    """Every complete run directory at or under ``path``, sorted; an error if there is none."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob(MANIFEST))
    if not found:
        raise FileNotFoundError(f"no complete run (a directory with {MANIFEST}) at or under '{path}'")
    return found


def config_of(run_dir: Path) -> str | None:
    """The job's config as YAML, resolved where it can be; ``None`` when the run was not made by the CLI.

    Hydra saves the composed config (interpolations unresolved) in ``.hydra/config.yaml``.
    """
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    cfg = OmegaConf.load(path)
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException:  # e.g. ${hydra:...}, which only resolves inside a Hydra job
        return OmegaConf.to_yaml(cfg)


def overrides_of(run_dir: Path) -> dict[str, Any]:
    """The job's Hydra overrides as ``{key: value}``, values parsed as YAML scalars where they are."""
    manifest = json.loads((run_dir / MANIFEST).read_text())
    out: dict[str, Any] = {}
    for item in manifest.get("overrides", []):
        key, _, raw = item.partition("=")
        key = key.lstrip("+~")
        try:
            value = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError:
            value = raw
        out[key] = value if np.isscalar(value) or value is None else raw
    return out


def _load(path: str | Path, name: str, columns: Sequence[str] | None, filters: Any) -> pd.DataFrame:
    frames = []
    for run_dir in run_dirs(path):
        present = [c for c in columns if c in pq.read_schema(run_dir / name).names] if columns else None
        table = pq.read_table(run_dir / name, columns=present, filters=filters)
        df = table.to_pandas()
        for key, value in overrides_of(run_dir).items():
            if key not in df.columns:
                df[key] = [value] * len(df)
        df["run_dir"] = str(run_dir)
        frames.append(df)
    return pd.concat(frames, ignore_index=True, sort=False)


def load_stats(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None) -> pd.DataFrame:
    """One row per captured tensor per call, from one run or every run of a sweep.

    Args:
        path: a run directory or any directory above run directories (a sweep).
        columns: read only these parquet columns (override and ``run_dir`` columns are always added).
        filters: pyarrow filters applied while reading, e.g. ``[("kind", "=", "param_grad")]``.
    """
    return _load(path, "stats.parquet", columns, filters)


def load_steps(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None) -> pd.DataFrame:
    """One row per step per run: ``loss``, ``wall_time_s`` and the number of captures.

    Example (a sweep's loss curves, one column per job):
        >>> load_steps(sweep).pivot(index="step", columns="run_dir", values="loss")
    """
    return _load(path, "steps.parquet", columns, filters)


def load_tensors(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None) -> pd.DataFrame:
    """Captured tensors with a ``tensor`` column of numpy arrays in their original shape and dtype.

    ``values`` (the flat float32 list stored in parquet) is replaced by ``tensor``.
    """
    wanted = None if columns is None else sorted({*columns, "values", "shape", "dtype"})
    df = _load(path, "tensors.parquet", wanted, filters)
    df["tensor"] = [
        np.asarray(values, dtype=np.float32).reshape(shape).astype(_NUMPY_DTYPES.get(dtype, np.float32))
        for values, shape, dtype in zip(df["values"], df["shape"], df["dtype"])
    ]
    return df.drop(columns="values")


#: Kinds that hold gradients (the rest hold activations).
GRADIENT_KINDS = ("grad_output", "grad_input", "param_grad")


def per_layer(stats: pd.DataFrame, kind: str, step: int | None = None) -> pd.DataFrame:
    """Rows of one ``kind`` at one step (default the first), in depth order, with ``label`` and ``abs_max``.

    Depth order is forward call order; gradients arrive in backward from the last layer to the
    first, so rows recorded in phase ``backward`` are reversed. ``param_grad`` is read from the
    accumulated ``.grad`` (phase ``after_backward``) when the run recorded it. When several hooks
    record the same layer, the first one's row is kept. ``label`` names the
    layer, with the parameter (``fc.bias``), a non-default slot (``split[1]``) or a repeated call
    (``layer1.0.relu #1``), so each label is one line in a plot.
    """
    rows = stats[stats["kind"] == kind]
    if rows.empty:
        return rows.assign(label=pd.Series(dtype=str), abs_max=pd.Series(dtype=float))
    step = int(rows["step"].min()) if step is None else step
    rows = rows[rows["step"] == step]
    if kind == "param_grad" and (rows["phase"] == "after_backward").any():
        rows = rows[rows["phase"] == "after_backward"]
    rows = rows.drop_duplicates(["run_dir", "layer", "slot", "call"])  # several hooks on one layer: the first
    if (rows["phase"] == "backward").all():
        rows = rows.iloc[::-1]
    labels = [label_of(layer, kind, slot, call)
              for layer, slot, call in zip(rows["layer"], rows["slot"], rows["call"])]
    return rows.assign(label=labels, abs_max=np.maximum(rows["max"].abs(), rows["min"].abs())
                       ).reset_index(drop=True)


def label_of(layer: str, kind: str, slot: str, call: int) -> str:
    """A capture's name in plots and exports: ``conv``, ``fc.bias``, ``split[1]``, ``relu #1``."""
    name = layer or "(model)"
    if kind == "param_grad":
        name = f"{name}.{slot}"
    elif slot != "0":
        name = f"{name}[{slot}]"
    return f"{name} #{call}" if call else name


def abnormal(stats: pd.DataFrame) -> pd.DataFrame:
    """Captures that look broken, one row per (run, hook, layer, kind, slot) and problem.

    Problems: ``non-finite`` (NaN or Inf elements), ``zero gradient`` (every captured gradient
    exactly 0: nothing flows back through the layer), ``all zero`` (an activation that is 0
    everywhere, e.g. a ReLU whose every unit is dead).
    """
    keys = ["run_dir", "hook", "layer", "kind", "slot"]
    found = []
    for key, group in stats.groupby(keys, sort=False):
        nan, inf = int(group["nan_count"].sum()), int(group["inf_count"].sum())
        n = len(group)
        if nan or inf:
            bad = int(((group["nan_count"] > 0) | (group["inf_count"] > 0)).sum())
            found.append((*key, "non-finite", f"{nan} NaN and {inf} Inf elements in {bad} of {n} capture(s)"))
        elif key[3] in GRADIENT_KINDS and (group["l2"] == 0).all():
            found.append((*key, "zero gradient", f"exactly 0 in each of {n} capture(s)"))
        elif key[3] not in GRADIENT_KINDS and (group["zero_frac"] == 1).all():
            found.append((*key, "all zero", f"0 everywhere in each of {n} capture(s)"))
    return pd.DataFrame(found, columns=[*keys, "problem", "detail"])


def dead_units(tensors: pd.DataFrame) -> pd.DataFrame:
    """Units (dim 1: channels or features) of non-negative captured outputs that are 0 for every sample.

    Only outputs whose every kept value is >= 0 are examined (what a ReLU produces); a unit is
    dead when it is 0 at every sample, position and step kept. ``tensors`` is ``load_tensors``'s
    frame. One row per (run, hook, layer, slot): ``units``, ``dead``, ``dead_frac``.
    """
    keys = ["run_dir", "hook", "layer", "slot"]
    rows = tensors[tensors["kind"] == "output"]
    found = []
    for key, group in rows.groupby(keys, sort=False):
        arrays = [t for t in group["tensor"] if t.ndim >= 2]
        if not arrays or any(t.min() < 0 for t in arrays) or len({t.shape[1] for t in arrays}) > 1:
            continue
        alive = np.zeros(arrays[0].shape[1], dtype=bool)
        for t in arrays:
            alive |= (np.moveaxis(t, 1, 0).reshape(t.shape[1], -1) != 0).any(axis=1)
        found.append((*key, alive.size, int((~alive).sum()), float((~alive).mean())))
    return pd.DataFrame(found, columns=[*keys, "units", "dead", "dead_frac"])
