"""Whole-process costs, measured on child processes: start-up time and peak memory of a run."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_child(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``python ARGS`` run from the project root; raises if it fails.

    CPU time (user + system of the child) does not count waiting for a core another process holds.
    """
    with tempfile.TemporaryFile() as err:
        before = os.times()
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        proc.wait()
        elapsed = time.perf_counter() - start
        after = os.times()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"python {' '.join(args)} exited {proc.returncode}: {err.read().decode()[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return elapsed, cpu


def runner_args(out_dir: str, *overrides: str) -> list[str]:
    return ["-m", "runner", *overrides, f"hydra.run.dir={out_dir}"]


def startup(reps: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of ``python -m runner hooks=none model=convnet`` and of importing torch+torchvision."""
    times: dict[str, list[tuple[float, float]]] = {"python -m runner hooks=none model=convnet": [],
                                                   'python -c "import torch, torchvision"': []}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for i in range(reps):
            times["python -m runner hooks=none model=convnet"].append(
                _run_child(runner_args(f"{tmp}/{i}", "hooks=none", "model=convnet")))
            times['python -c "import torch, torchvision"'].append(
                _run_child(["-c", "import torch, torchvision"]))
    return times


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
