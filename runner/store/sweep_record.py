"""``sweep.json``: every job of a sweep in one file (overrides, run state, exit reason, run directory),
true from the sweep's start to its end, and after it was stopped.

The sweep's first callback writes it before any job runs, every job ``pending``; each job updates
its own entry when it starts (``running``, with the run id of its claim) and when it ends (``ok``,
``failed``, ``interrupted``, or what the scheduler did: ``cancelled``, ``timeout``, ``requeued``),
whatever process it runs in (the basic launcher's, a joblib worker, a submitit job): each update
is a read-modify-write under an ``fcntl`` lock, and the file is replaced atomically (temporary
name, fsync, rename), so a reader sees one whole version. A job killed outright (SIGKILL of the
launcher, a crashed node) updates nothing, so ``read_sweep`` reconciles a ``running`` entry with
the job's directory: its manifest committed by that run means ``ok``, a live claim
(``.runner.lock``) means still ``running``, anything else ``interrupted``. A ``pending`` entry of a sweep that stopped is a job that never started.

``sacct`` shows what the scheduler did (a job that failed at run time still ends ``COMPLETED``:
the runner returns normally so that submitit stores a result); ``sweep.json`` shows what the run
did. The loaders read their run directories and failed jobs from it when it is there.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from common.durable import replaced
from common.job_status import STATUS, StatusError, read_job_status
from common.sweep_format import MISSING, SWEEP, UNFINISHED, counts, load_record, read_sweep, reconcile

_LOCK = ".sweep.json.lock"


def write_sweep(sweep_dir: str | Path, jobs: Sequence[dict], **fields) -> Path:
    """Write ``sweep.json`` with ``jobs`` and ``fields`` (atomically, under the sweep's lock) and return its path.

    ``jobs``: one ``{"num", "overrides", "state", "error", "run_dir"}`` per job, ``run_dir``
    relative to ``sweep_dir``; ``fields``: the sweep's own keys (``command``, ``kept``).
    """
    with _locked(Path(sweep_dir)):
        return _write(Path(sweep_dir), {**fields, "jobs": list(jobs)})


def update_job(sweep_dir: str | Path, run_dir: str | Path, **fields) -> bool:
    """Set ``fields`` (``state``, ``error``, ``run_id``) in the entry of the job writing ``run_dir``;
    ``False`` when ``sweep.json`` lists no such job."""
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir):
        record = load_record(sweep_dir)
        job = _entry(sweep_dir, record, run_dir)
        if job is None:
            return False
        job.update(fields)
        _write(sweep_dir, record)
    return True


def finish_sweep(sweep_dir: str | Path) -> list[dict]:
    """Rewrite ``sweep.json`` once every job has returned and return its jobs (absolute ``run_dir``):
    each entry reconciled, and one a job left unfinished (its update was lost) as its ``status.json``
    says (``missing``: none written)."""
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir):
        record = load_record(sweep_dir)
        if record is None:
            return []
        for i, job in enumerate(record["jobs"]):
            job = reconcile({**job, "run_dir": str(sweep_dir / job["run_dir"])})
            if job["state"] in UNFINISHED:
                status = _job_status(Path(job["run_dir"]))
                job.update(state=status.get("status", MISSING), error=status.get("error", f"the job wrote no {STATUS}"))
            record["jobs"][i] = {**job, "run_dir": record["jobs"][i]["run_dir"]}
        _write(sweep_dir, record)
    return read_sweep(sweep_dir)


def find_sweep(run_dir: str | Path, levels: int = 4) -> Path | None:
    """The sweep directory whose ``sweep.json`` lists ``run_dir`` as a job's (looked for in its parents)."""
    for parent in list(Path(os.path.abspath(run_dir)).parents)[:levels]:
        if _entry(parent, load_record(parent), run_dir) is not None:
            return parent
    return None


def job_entry(sweep_dir: str | Path, run_dir: str | Path) -> dict | None:
    """The entry (reconciled, absolute ``run_dir``) of the job writing ``run_dir``, or ``None``."""
    job = _entry(Path(sweep_dir), load_record(Path(sweep_dir)), run_dir)
    return None if job is None else reconcile({**job, "run_dir": str(Path(sweep_dir) / job["run_dir"])})


def _write(sweep_dir: Path, record: dict) -> Path:
    path = sweep_dir / SWEEP
    record["states"] = counts(record["jobs"])
    record["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    head = {key: value for key, value in record.items() if key != "jobs"}
    # one job a line: readable, and json's C encoder (indent=2 takes the pure-Python one: 0.1 s for 1,000 jobs)
    text = json.dumps(head)[:-1] + ', "jobs": [\n' + ",\n".join(json.dumps(job) for job in record["jobs"]) + "\n]}\n"
    with replaced(path, sync_directory=False) as tmp:  # whole, old or new (a reader reconciles a lost update)
        tmp.write_text(text)
    return path


@contextlib.contextmanager
def _locked(sweep_dir: Path) -> Iterator[None]:
    """The sweep's lock (``fcntl``: released by the kernel when its holder dies, and held across
    NFS hosts where the server's lock manager runs)."""
    with open(sweep_dir / _LOCK, "a") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)


def _job_status(run_dir: Path) -> dict:
    """Where one job of a sweep says how it ended (``common.job_status``); ``{}`` for none or an unreadable one."""
    try:
        return read_job_status(run_dir) or {}
    except StatusError:
        return {}


def _entry(sweep_dir: Path, record: dict | None, run_dir: str | Path) -> dict | None:
    """The job of ``record`` (the sweep at ``sweep_dir``) that writes ``run_dir``: paths compared as
    written, then resolved (one resolve per job would cost a 1,000-job sweep 0.1 s per update)."""
    jobs = (record or {}).get("jobs", ())
    target = os.path.normpath(os.path.abspath(run_dir))
    for job in jobs:
        if os.path.normpath(os.path.join(os.path.abspath(sweep_dir), job["run_dir"])) == target:
            return job
    target = os.path.realpath(run_dir)
    return next((job for job in jobs if os.path.realpath(sweep_dir / job["run_dir"]) == target), None)
