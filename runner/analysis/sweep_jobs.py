"""A sweep's jobs as the loaders see them: from ``sweep.json`` when the sweep wrote one.

``sweep.json`` (``runner.store.sweep_record``) lists every job with its run state, so the loaders
neither search the tree for manifests nor miss a job that wrote no data; directories without it
(a single run, a sweep from before it) are searched as before.
"""
from __future__ import annotations

from pathlib import Path

from runner.store.commit import MANIFEST
from runner.store.sweep_record import OK, read_sweep


def listed_runs(path: str | Path) -> list[Path] | None:
    """The complete runs ``sweep.json`` lists at ``path``; ``None`` without one (or when it lists none)."""
    jobs = read_sweep(path)
    runs = [Path(job["run_dir"]) for job in jobs or [] if job["state"] == OK and
            (Path(job["run_dir"]) / MANIFEST).is_file()]
    return runs or None


def listed_failures(path: str | Path) -> list[dict] | None:
    """``{"job_dir", "overrides", "error"}`` of each job ``sweep.json`` lists as not ``ok``; ``None`` without one."""
    jobs = read_sweep(path)
    if jobs is None:
        return None
    return [{"job_dir": job["run_dir"], "overrides": " ".join(job["overrides"]),
             "error": f"{job['state']}: {job['error']}" if job["state"] != "failed" else str(job["error"])}
            for job in jobs if job["state"] != OK]
