"""A run's resume point (``.resume``): where a requeued job goes on from; one writer, one reader.

One file: the state after the last complete step (model, optimizer, random generators, the hook
entries' lifetimes, the config's hash) and the rows written until then, each table as Parquet
bytes. Written through the durable write (``common.durable.replaced``: temporary name, fsync,
rename, directory fsync), so a job killed while saving leaves the previous point whole or none,
never half of one; and the next claim of the directory removes a temporary file a killed writer left.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from common.durable import replaced

RESUME = ".resume"
_TABLES = "tables"


def write_resume_point(out_dir: str | Path, state: dict, tables: dict[str, pa.Table]) -> Path:
    """``state`` and the rows kept so far (``tables`` by file name), durable as ``out_dir``'s resume point."""
    encoded = {}
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        encoded[name] = sink.getvalue().to_pybytes()
    path = Path(out_dir) / RESUME
    with replaced(path) as tmp:
        torch.save({**state, _TABLES: encoded}, tmp)
    return path


def read_resume_point(out_dir: str | Path) -> tuple[dict, dict[str, pa.Table]] | None:
    """``out_dir``'s resume point: its state and its kept rows by file name; ``None`` when there is none."""
    path = Path(out_dir) / RESUME
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    tables = {name: pq.read_table(pa.BufferReader(data)) for name, data in sorted(state.pop(_TABLES).items())}
    return state, tables


def has_resume_point(out_dir: str | Path) -> bool:
    return (Path(out_dir) / RESUME).is_file()


def remove_resume_point(out_dir: str | Path) -> None:
    """Drop the resume point (the run is committed, or it is another config's)."""
    with contextlib.suppress(FileNotFoundError):
        (Path(out_dir) / RESUME).unlink()
