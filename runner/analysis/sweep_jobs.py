"""A sweep's jobs as the loaders see them: from ``sweep.json`` when the sweep wrote one.

``sweep.json`` (``runner.store.sweep_record``) lists every job with its run state, reconciled with
the job directories when it is read, so the loaders neither search the tree for manifests nor
miss a job that wrote no data: one that failed, was interrupted, or never started because the
sweep was stopped. Directories without it (a single run, a sweep from before it) are searched as before.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from common.records import MANIFEST
from common.sweep_format import FAILED, OK, PENDING, RUNNING, read_sweep, state_line, swept_values

#: What a job that never ran says in ``failed_jobs``'s ``error``.
NOT_STARTED = "not started: the sweep stopped before it (resume=true runs it)"


class IncompleteSweepWarning(UserWarning):
    """Jobs of a sweep that wrote no data: failed, interrupted, not started (``sweep.json``)."""


def listed_runs(path: str | Path) -> list[Path] | None:
    """The complete runs ``sweep.json`` lists at ``path`` (one warning line when some of its jobs are
    not complete, naming them: ``IncompleteSweepWarning``); ``None`` without one."""
    jobs = read_sweep(path)
    if jobs is None:
        return None
    runs = [Path(job["run_dir"]) for job in jobs if job["state"] == OK and (Path(job["run_dir"]) / MANIFEST).is_file()]
    if 0 < len(runs) < len(jobs):  # none: the loaders' error says why
        warnings.warn(f"{path}: {state_line(jobs)}; reading the {len(runs)} complete run(s)", IncompleteSweepWarning,
                      stacklevel=4)
    return runs


def listed_failures(path: str | Path) -> list[dict] | None:
    """``{"job_dir", "overrides", "error"}`` of each job ``sweep.json`` lists as neither ``ok`` nor
    ``running``, its state before the error unless ``failed``; ``None`` without one."""
    jobs = read_sweep(path)
    if jobs is None:
        return None
    return [{"job_dir": job["run_dir"], "overrides": " ".join(job["overrides"]), "error": _why(job)}
            for job in jobs if job["state"] not in (OK, RUNNING)]


def listed_states(path: str | Path) -> list[dict] | None:
    """One ``{"num", "overrides", "state", "error", "run_dir"}`` per job of the sweep at ``path``,
    ``overrides`` its swept values only; ``None`` without ``sweep.json``."""
    jobs = read_sweep(path)
    if jobs is None:
        return None
    values = swept_values(jobs)
    return [{"num": job["num"], "overrides": values[job["num"]], "state": job["state"],
             "error": NOT_STARTED if job["state"] == PENDING else job.get("error"), "run_dir": job["run_dir"]}
            for job in jobs]


def incomplete(path: str | Path) -> str | None:
    """``state_line`` of the sweep at ``path`` when some of its jobs are not complete, else ``None``."""
    jobs = read_sweep(path)
    if not jobs or all(job["state"] == OK for job in jobs):
        return None
    return state_line(jobs)


def _why(job: dict) -> str:
    if job["state"] == PENDING:
        return NOT_STARTED
    return str(job["error"]) if job["state"] == FAILED else f"{job['state']}: {job['error']}"
