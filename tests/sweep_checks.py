"""How the sweep tests wait for a sweep's jobs (``sweep.json``) and read its tables to compare them
with another sweep's of the same jobs."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

import runner.analysis as analysis
from common.records import LOCK
from common.sweep_format import read_sweep

#: Columns that differ between two runs of the same jobs: where and how they ran (the launcher's
#: settings are overrides of the job's too), and how long they took.
VARYING = ["run_dir", "quiet", "wall_time_s", "peak_memory_bytes"]


def wait_for(sweep: Path, done, timeout: float = 600) -> list[dict]:
    """The sweep's jobs (``read_sweep``) once ``done(jobs)``; ``TimeoutError`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        jobs = read_sweep(sweep)
        if jobs and done(jobs):
            return jobs
        time.sleep(0.05)
    raise TimeoutError(f"{sweep}: {read_sweep(sweep)}")


def mid_run(sweep: Path, num: int) -> bool:
    """Job ``num`` is past its start and before its commit's end: it holds its directory's claim (``LOCK``, taken
    before its first step, released after its commit) or writes its files (a temporary file of its run exists).
    A run's rows are buffered until a row group fills, so a short job's temporary files exist only while it commits:
    waiting for them alone missed a job of 300 steps that committed between two polls."""
    job = sweep / str(num)
    return (job / LOCK).exists() or any(job.glob(".*.tmp-*"))


def tables(sweep: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``load_stats`` and ``load_steps`` of ``sweep`` without the ``VARYING`` and Hydra columns."""
    stats, steps = analysis.load_stats(sweep), analysis.load_steps(sweep)
    return tuple(frame.drop(columns=[c for c in frame.columns if c in VARYING or c.startswith("hydra")])
                 .reset_index(drop=True) for frame in (stats, steps))
