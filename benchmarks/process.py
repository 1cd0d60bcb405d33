"""Whole-process costs, measured on child processes: peak memory and the first step of a run (start-up: ``benchmarks.startup``)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.startup import run_child

ROOT = Path(__file__).resolve().parents[1]


def _run_child(args: list[str]) -> None:
    """``python ARGS`` run from the project root; raises with its last line on stderr if it fails."""
    child = run_child(args, ROOT)
    if child.status != 0:
        raise RuntimeError(f"python {' '.join(args)} exited {child.status}: {child.last_line}")


def runner_args(out_dir: str, *overrides: str) -> list[str]:
    return ["-m", "runner", *overrides, f"hydra.run.dir={out_dir}"]


def peak_memory(step_counts: tuple[int, ...], overrides: list[str]) -> dict[int, int]:
    """Peak memory of a ``stats`` run of each length, from its own ``steps.parquet``.

    The child's ``ru_maxrss`` cannot be used: Linux counts the parent's memory at ``fork``.
    """
    import pyarrow.parquet as pq

    peaks = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for steps in step_counts:
            out = f"{tmp}/{steps}"
            _run_child(runner_args(out, "hooks=stats", f"steps={steps}", *overrides))
            peaks[steps] = max(pq.read_table(f"{out}/steps.parquet").column("peak_memory_bytes").to_pylist())
    return peaks


def first_step_walls(overrides: list[str]) -> list[float]:
    """``wall_time_s`` of every step of a run in a child whose kernel cache is empty (nothing built yet)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="bench-first-step-") as tmp:
        env = {**os.environ, "HOOK_RUNNER_CACHE": f"{tmp}/cache"}
        subprocess.run([sys.executable, *runner_args(f"{tmp}/run", *overrides)], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        steps = pq.read_table(f"{tmp}/run/steps.parquet").to_pylist()
    return [row["wall_time_s"] for row in steps if row["split"] == "train"]
