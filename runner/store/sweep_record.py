"""``sweep.json``: every job of a sweep in one file (overrides, run state, exit reason, run directory).

Written by the sweep's closing callback from the jobs' ``status.json``, so a job that wrote no data
(failed, cancelled, timed out) cannot be missed, whatever the launcher. ``sacct`` shows what the
scheduler did (a job that failed at run time still ends ``COMPLETED``: the runner returns normally
so that submitit stores a result); ``sweep.json`` shows what the run did. The loaders read their
run directories and failed jobs from it when it is there.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

SWEEP = "sweep.json"
#: The run state of a job with a complete run; every other state wrote no data.
OK = "ok"


def write_sweep(sweep_dir: str | Path, jobs: Sequence[dict]) -> Path:
    """Write ``sweep.json`` (atomically: a reader sees the old file or the new one) and return its path.

    ``jobs``: one ``{"num", "overrides", "state", "error", "run_dir"}`` per job, ``run_dir``
    relative to ``sweep_dir``.
    """
    path = Path(sweep_dir) / SWEEP
    tmp = path.with_name(f".{SWEEP}.{os.getpid()}")
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    tmp.write_text(json.dumps({"jobs": list(jobs), "states": counts}, indent=2) + "\n")
    tmp.replace(path)
    return path


def read_sweep(path: str | Path) -> list[dict] | None:
    """The jobs of the sweep at ``path`` with absolute ``run_dir``, or ``None`` where there is no ``sweep.json``."""
    path = Path(path)
    try:
        jobs = json.loads((path / SWEEP).read_text())["jobs"]
    except (OSError, ValueError, KeyError):
        return None
    return [{**job, "run_dir": str(path / job["run_dir"])} for job in jobs]
