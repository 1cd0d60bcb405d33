"""``resume=true``: the same sweep command again continues the sweep its directory holds.

The command line is compared with the sweep's ``sweep.json`` before any plan is compiled: the
same jobs (each job's overrides, ``resume`` aside) or one line naming what differs. When the sweep
starts, the jobs that completed are kept, ``ok`` in the new record, and the failed ones stay
``failed`` unless ``resume=failed``; every other job (interrupted, killed, never started, cancelled
by the scheduler) is ``pending`` and runs. Hydra launches every job of the command, each in its
numbered directory (a launcher numbers a batch's jobs from one index, so kept jobs cannot be left
out of it), so ``runner.cli.execute`` returns at once from a job its record lists as kept, after
checking that its complete run is this job's: its manifest's config hash is this job's config's.

``resume`` is how the command runs, not what a job computes: a job records its config with
``resume: false`` and its overrides without it, so a resumed sweep's files are an uninterrupted
sweep's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import yaml
from omegaconf import DictConfig

from common.errors import choice_error
from common.run_config import RunConfigError, read_run_config
from runner.store.commit import read_manifest
from runner.store.provenance import differences
from common.job_status import STATUS
from common.sweep_format import FAILED, OK, PENDING, SWEEP, WORDS, read_record

KEY = "resume"
#: The values of ``resume``: off, on (failed jobs stay failed), on and failed jobs run again.
CHOICES = ("false", "true", "failed")
_LINE = re.compile(rf"^{KEY}: .*$", re.M)


def resume_mode(config: DictConfig) -> str | None:
    """``"true"`` or ``"failed"`` when the command resumes a sweep, ``None`` when not; a bad value
    raises ``ConfigError`` naming the choices."""
    value = config.get(KEY)
    text = str(value).lower() if isinstance(value, (bool, str)) or value is None else repr(value)
    if text in ("false", "none"):
        return None
    if text not in CHOICES:
        raise choice_error(KEY, value, CHOICES)
    return text


def swept(overrides: Sequence[str]) -> list[str]:
    """``overrides`` without ``resume``: what a job is, whatever command ran it."""
    return [o for o in overrides if o.lstrip("+~").partition("=")[0] != KEY]


def as_recorded(plan):
    """``plan`` as a sweep's job records it: config with ``resume: false``, overrides without it."""
    return dataclasses.replace(plan, config_yaml=_LINE.sub(f"{KEY}: false", plan.config_yaml),
                               overrides=tuple(swept(plan.overrides)))


def config_hash(config_yaml: str) -> str:
    """The manifest's ``config_hash`` of a run whose resolved config is ``config_yaml``."""
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def command_problem(config: DictConfig, jobs: Sequence[Sequence[str]], multirun: bool) -> str | None:
    """Why this command cannot resume the sweep in its directory (one line), or ``None``.

    ``config``: the first job's, Hydra's node included; ``jobs``: each job's overrides as given.
    """
    if not multirun:
        return f"{KEY}: continues a sweep (python -m runner -m ...); a single run has nothing to resume"
    if not any(o.startswith("hydra.sweep.dir=") for o in jobs[0]):
        return (f"{KEY}: name the sweep's directory, hydra.sweep.dir=DIR (without it a sweep writes a new "
                f"time-stamped directory, which holds nothing to resume)")
    sweep_dir = Path(str(config.hydra.sweep.dir))
    record = read_record(sweep_dir)
    if record is None:
        return f"{KEY}: '{sweep_dir}' holds no sweep to resume (no {SWEEP}); run the sweep without {KEY}"
    before = [swept(job["overrides"]) for job in record["jobs"]]
    now = [swept(o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/"))) for job in jobs]
    if before == now:
        return None
    return (f"{KEY}: this command's jobs are not the sweep's in '{sweep_dir}' ({difference(before, now)}); "
            f"resume with the sweep's own command line, or run this one with overwrite=true or another "
            f"hydra.sweep.dir")


def difference(before: Sequence[Sequence[str]], now: Sequence[Sequence[str]]) -> str:
    """What differs between two sweeps' jobs, per key: ``seed: 0, 1 in the sweep, 0, 1, 2 now``."""
    old, new = _values(before), _values(now)
    found = [f"{key}: {_show(old.get(key))} in the sweep, {_show(new.get(key))} now"
             for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]
    return "; ".join(found) or f"the same values in another order: {len(before)} jobs numbered otherwise"


def _values(jobs: Sequence[Sequence[str]]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for job in jobs:
        for override in job:
            key, _, value = override.partition("=")
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return values


def _show(values: list[str] | None) -> str:
    return "(not set)" if values is None else ", ".join(values)


def carried(previous: Sequence[dict], mode: str) -> dict[int, dict]:
    """The entries a resumed sweep starts with, by job number: ``ok`` jobs kept, ``failed`` ones
    kept unless ``mode`` is ``failed``, every other one ``pending``."""
    out = {}
    for job in previous:
        state = job["state"] if job["state"] == OK or (job["state"] == FAILED and mode != "failed") else PENDING
        out[job["num"]] = {"state": state, "error": job.get("error") if state != PENDING else None}
    return out


def unfinished_jobs(jobs: Sequence[dict]) -> list[str]:
    """One line for each of a sweep's ``jobs`` (``read_record``'s: absolute ``run_dir``) that did not
    complete: its number, overrides, state and error, and where to read more (the scheduler's log
    files of the job, else the ``status.json`` it wrote, else its directory)."""
    lines = []
    for job in jobs:
        if job["state"] == OK:
            continue
        status = Path(job["run_dir"]) / STATUS
        where = (f"its log: {', '.join(job['logs'])}" if job.get("logs") else
                 f"its status: {status}" if status.is_file() else f"its directory: {job['run_dir']}")
        state, error = WORDS.get(job["state"], job["state"]), job.get("error") or ""
        said = error if error.startswith(state) else f"{state}: {error}" if error else state  # not 'cancelled: cancelled (...'
        lines.append(f"job {job['num']} ({' '.join(job['overrides'])}): {said}; {where}")
    return lines


def kept_problem(plan, out_dir: str | Path) -> str | None:
    """Why the complete run in ``out_dir`` is not the run of ``plan`` (``as_recorded``), or ``None``."""
    manifest = read_manifest(Path(out_dir)) or {}
    if manifest.get("config_hash") == config_hash(plan.config_yaml):
        return None
    if not manifest:
        return f"{KEY}: '{out_dir}' was complete when the sweep was resumed and has no manifest now"
    try:
        stored = read_run_config(out_dir)
    except (OSError, RunConfigError):
        stored = {}
    changed = differences(stored, yaml.safe_load(plan.config_yaml) or {})[:3] or ["its config.yaml is not its manifest's"]
    return (f"{KEY}: the complete run in '{out_dir}' was made with another config ({'; '.join(changed)}); "
            f"it is left as it was: rerun the sweep with overwrite=true to replace it")
