"""A sweep's ``sweep.json`` read: its jobs, each as its directory shows it, and the states they are in.

``runner.store.sweep_record`` writes the file (under its lock, atomically) as the sweep's jobs start
and end; the loaders (``runner.analysis``), the command line and the sweep's closing report read it
here. A job killed outright updates nothing, so ``read_record`` reconciles a ``running`` entry with
the job's directory: its manifest committed by that run means ``ok``, a live claim (``.runner.lock``,
``common.claim_record``) means still ``running``, anything else ``interrupted``.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from common.claim_record import live_holder
from common.manifest import ManifestError, read_manifest

SWEEP = "sweep.json"
#: Jobs named per state in a one-line account of a sweep.
MOST_NAMED = 8
#: The run state of a job with a complete run; every other state wrote no data.
OK = "ok"
PENDING, RUNNING, FAILED, INTERRUPTED, MISSING = "pending", "running", "failed", "interrupted", "missing"
#: States a job is not done in: it has not started, or runs (or, after a requeue, will run again).
UNFINISHED = (PENDING, RUNNING, "requeued")
#: How the states read in a sentence, in the order they are counted.
WORDS = {OK: "complete", FAILED: "failed", INTERRUPTED: "interrupted", "cancelled": "cancelled",
         "timeout": "timed out", MISSING: "without a status", "requeued": "requeued", RUNNING: "running",
         PENDING: "not started"}


def read_record(path: str | Path) -> dict | None:
    """``sweep.json`` at ``path`` with its jobs reconciled (``reconcile``) and their ``run_dir``
    absolute, or ``None`` where there is none."""
    record = load_record(Path(path))
    if record is None:
        return None
    jobs = [{**job, "run_dir": str(Path(path) / job["run_dir"])} for job in record["jobs"]]
    return {**record, "jobs": [reconcile(job) for job in jobs]}


def read_sweep(path: str | Path) -> list[dict] | None:
    """The jobs of the sweep at ``path`` (``read_record``), or ``None`` where there is no ``sweep.json``."""
    record = read_record(path)
    return None if record is None else record["jobs"]


def reconcile(job: dict) -> dict:
    """``job`` (absolute ``run_dir``) as its directory shows it, where its process could not say so.

    A ``running`` job whose run committed is ``ok``; whose claim is still held by a live process,
    ``running``; else its process was killed: ``interrupted``. The other states are what the job
    itself wrote.
    """
    if job.get("state") != RUNNING:
        return job
    run_dir = Path(job["run_dir"])
    run_id = job.get("run_id")
    if run_id and _committed_run_id(run_dir) == run_id:
        return {**job, "state": OK, "error": None}
    if live_holder(run_dir, time.time) is not None:
        return job
    return {**job, "state": INTERRUPTED, "error": "its process ended without a word (killed: SIGKILL, "
                                                  "out of memory, a lost node); nothing of it was written"}


def counts(jobs: Sequence[dict]) -> dict[str, int]:
    """How many ``jobs`` are in each state, in ``WORDS`` order."""
    found = [job["state"] for job in jobs]
    order = [*WORDS, *sorted(set(found) - set(WORDS))]
    return {state: found.count(state) for state in order if state in found}


def swept_values(jobs: Sequence[dict]) -> dict[int, str]:
    """Each job's overrides that set a swept key (one whose value is not the same in every job), by
    job number: ``hooks.clip.max=0.1 seed=2``; every override of a one-job sweep."""
    keys: dict[str, set[str]] = {}
    for job in jobs:
        for override in job["overrides"]:
            key, _, value = override.partition("=")
            keys.setdefault(key, set()).add(value)
    swept = {key for key, values in keys.items() if len(values) > 1} or set(keys)
    return {job["num"]: " ".join(o for o in job["overrides"] if o.partition("=")[0] in swept) for job in jobs}


def state_line(jobs: Sequence[dict], most: int = MOST_NAMED) -> str:
    """Where the sweep's ``jobs`` stand, in one line: ``6 jobs: 2 complete, 1 interrupted (job 2:
    seed=2), 3 not started (job 3: seed=3; job 4: seed=4; job 5: seed=5)``; the jobs of each state
    but ``ok`` are named, the first ``most`` of them."""
    values = swept_values(jobs)
    parts = []
    for state, count in counts(jobs).items():
        named = [f"job {job['num']}: {values[job['num']]}" for job in jobs if job["state"] == state][:most]
        more = f"; {count - len(named)} more" if count > len(named) else ""
        parts.append(f"{count} {WORDS.get(state, state)}" + (f" ({'; '.join(named)}{more})" if state != OK else ""))
    return f"{len(jobs)} jobs: {', '.join(parts)}"


def load_record(sweep_dir: Path) -> dict | None:
    record = _read_json(sweep_dir / SWEEP)
    return record if isinstance(record.get("jobs"), list) else None


def _committed_run_id(run_dir: Path) -> str | None:
    """The ``run_id`` of the run committed in ``run_dir``; ``None`` for none or a damaged manifest."""
    try:
        return (read_manifest(run_dir) or {}).get("run_id")
    except (OSError, ManifestError):
        return None


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
