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

from runner.outputs import MANIFEST

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


def load_steps(path: str | Path) -> pd.DataFrame:
    """One row per step per run: ``loss``, ``wall_time_s`` and the number of captures."""
    return _load(path, "steps.parquet", None, None)


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
