"""Parquet costs: captured tensors written by ``RunOutputs`` against pyarrow alone and a raw
file write of the same bytes, and a stats table written and read back.

Every writer ends with ``fsync``, as ``RunOutputs`` does when it commits, so all three pay for
getting the bytes to disk and none is flattered by the page cache.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hooks.mechanism.recorder import StepCaptures
from runner.store.outputs import TENSORS_SCHEMA, RunOutputs, parquet_options


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_runner(captures: StepCaptures, steps: int, out_dir: Path) -> None:
    """``steps`` copies of a step's captures through the real ``RunOutputs``."""
    with RunOutputs(out_dir, "benchmark: parquet throughput") as outputs:
        for step in range(steps):
            outputs.write_step(step, captures, loss=None, wall_time_s=0.0)


def write_pyarrow(captures: StepCaptures, steps: int, out_dir: Path) -> None:
    """The same rows and schema with pyarrow only: zero-copy list arrays, one ``write_table``."""
    kept = [t.reshape(-1).numpy() for t in captures.kept]
    ids = {name: [captures.columns[name][r] for r in captures.kept_rows] for name in TENSORS_SCHEMA.names
           if name in captures.columns}
    chunks = []
    for step in range(steps):
        cols = {"step": [step] * len(kept), **ids}
        arrays = [pa.array(cols[f.name], f.type) for f in TENSORS_SCHEMA if f.name != "tensor_values"]
        for i, values in enumerate(kept):
            row = [a.slice(i, 1) for a in arrays]
            offsets = pa.array(np.array([0, values.size], dtype=np.int64))
            chunks.append(pa.Table.from_arrays(row + [pa.LargeListArray.from_arrays(offsets, pa.array(values))],
                                               schema=TENSORS_SCHEMA))
    path = out_dir / "tensors.parquet"
    pq.write_table(pa.concat_tables(chunks), path, **parquet_options(TENSORS_SCHEMA))
    _fsync(path)


def write_raw(captures: StepCaptures, steps: int, out_dir: Path) -> None:
    """The tensors' bytes, one ``write`` each: the ceiling for any file format."""
    path = out_dir / "tensors.raw"
    with open(path, "wb") as f:
        for _ in range(steps):
            for t in captures.kept:
                f.write(memoryview(t.reshape(-1).numpy()))
        f.flush()
        os.fsync(f.fileno())


TENSOR_WRITERS: dict[str, Callable[[StepCaptures, int, Path], None]] = {
    "runner (RunOutputs)": write_runner,
    "pyarrow alone": write_pyarrow,
    "raw file write": write_raw,
}


def tensor_write_throughput(captures: StepCaptures, steps: int, reps: int) -> dict[str, list[float]]:
    """MB/s of each writer for ``steps`` steps of ``captures``, interleaved ``reps`` times."""
    nbytes = steps * sum(t.numel() * 4 for t in captures.kept)
    rates: dict[str, list[float]] = {name: [] for name in TENSOR_WRITERS}
    for _ in range(reps):
        for name, write in TENSOR_WRITERS.items():
            with tempfile.TemporaryDirectory(prefix="bench-write-") as tmp:
                start = time.perf_counter()
                write(captures, steps, Path(tmp))
                rates[name].append(nbytes / (time.perf_counter() - start) / 1e6)
    return rates


def stats_table_roundtrip(captures: StepCaptures, steps: int, reps: int) -> dict[str, list[float]]:
    """Seconds to write ``steps`` steps of statistics through ``RunOutputs`` and load them back."""
    import runner.analysis  # pandas: imported here, as analysis code does

    times: dict[str, list[float]] = {"write": [], "read": []}
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="bench-stats-") as tmp:
            start = time.perf_counter()
            write_runner(captures, steps, Path(tmp) / "run")
            mid = time.perf_counter()
            df = runner.analysis.load_stats(Path(tmp) / "run")
            end = time.perf_counter()
            if len(df) != steps * len(captures):
                raise RuntimeError(f"read back {len(df)} rows, wrote {steps * len(captures)}")
            times["write"].append(mid - start)
            times["read"].append(end - mid)
    return times
