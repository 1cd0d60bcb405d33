"""Where a sweep's job writes and how it ended, readable without torch: its directory (``job_dir``)
and its ``status.json`` with its entry of ``sweep.json`` (``write_status``).

Used by the run (``runner.cli.execute``), the directory checks (``runner.cli.taken_dirs``) and the
Slurm launcher plugin, which Hydra imports whenever it composes a config: so these import no torch,
and the sweep's record (``runner.store.sweep_record``: pyarrow, through the manifest) only when a
job's status is written or read, not when a command line is checked.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from hydra._internal.config_loader_impl import get_overrides_dirname  # Hydra's naming of a job, no public one
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from common.job_status import StatusError, read_job_status, write_job_status
from runner.cli.override_lines import parsed

log = logging.getLogger(__name__)

#: ``hydra.sweep.subdir`` as ``conf/config.yaml`` writes it: each job's directory is its number.
NUMBERED = "${hydra.job.num}"


def job_dir(config: DictConfig, num: int, overrides: Sequence[str]) -> Path:
    """Where job ``num`` of this sweep, of ``overrides``, will write: ``hydra.sweep.dir / hydra.sweep.subdir``."""
    return job_dirs(config, [(num, overrides)])[0]


def job_dirs(config: DictConfig, jobs: Iterable[tuple[int, Sequence[str]]]) -> list[Path]:
    """Where each job ``(num, overrides)`` of the sweep ``config`` is the primary config of will write.

    ``hydra.sweep.subdir`` is resolved under each job's own Hydra node: its number and what Hydra's
    composition of it names from its overrides (``name_job``; ``${hydra.job.override_dirname}`` is a
    subdir Hydra's docs suggest). The node is copied once for them all (a copy is 15 ms: once per job,
    three times a job, it was most of a 64-job sweep's start); the sweep's directory is read from
    ``config`` itself, whose ``${now:...}`` it keeps. The default subdir, ``${hydra.job.num}`` as
    written, is the job's number: no node is named for it (naming 64 jobs three times took 0.2 s of CPU)."""
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir") == NUMBERED:
        return [sweep_dir / str(num) for num, _ in jobs]
    root = OmegaConf.create({"hydra": OmegaConf.to_container(config.hydra, resolve=False)})
    dirs = []
    with open_dict(root):
        for num, overrides in jobs:
            root.hydra.job.num = root.hydra.job.id = num
            name_job(root.hydra, as_launched(overrides))
            dirs.append(sweep_dir / str(OmegaConf.select(root, "hydra.sweep.subdir")))
    return dirs


def name_job(node: DictConfig, task: Sequence[str]) -> None:
    """Set in Hydra's node ``node`` what Hydra's composition of a job of task overrides ``task`` sets from
    them: ``hydra.overrides.task`` and ``hydra.job.override_dirname``."""
    naming = node.job.config.override_dirname
    with read_write(node), open_dict(node):
        node.overrides.task = list(task)
        node.job.override_dirname = get_overrides_dirname(
            overrides=parsed(task), exclude_keys=list(naming.exclude_keys), item_sep=naming.item_sep,
            kv_sep=naming.kv_sep)


def as_launched(overrides: Sequence[str]) -> list[str]:
    """A job's task overrides (Hydra's own left out) as Hydra's basic sweeper hands them to the launcher
    (``BasicSweeper.split_arguments``: ``quiet=True`` for ``quiet=true``), which names its directory from them."""
    return [f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed(overrides)
            if not o.is_hydra_override()]


def write_status(out_dir: str | Path, overrides: Sequence[str], error: str | None, state: str | None = None) -> None:
    """Record how one job of a sweep ended (``error`` is ``None`` on success) in its ``status.json``
    and its entry of ``sweep.json``.

    ``state``: ``ok``, ``failed`` (the default for an error), ``interrupted``, or what the scheduler
    did: ``cancelled``, ``timeout``, ``requeued`` (a requeued job overwrites it when it ends).
    """
    from common.sweep_format import FAILED, OK

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    state = state or (FAILED if error else OK)
    write_job_status(out_dir, state, overrides, error)
    record_entry(out_dir, state=state, error=error, logs=scheduler_logs())


def scheduler_logs() -> list[str] | None:
    """The job's log files when a scheduler runs it (submitit: its stdout and stderr, under the launcher's
    ``submitit_folder``), for its entry of ``sweep.json``; ``None`` where the launcher's own terminal has
    its output (the basic and joblib launchers)."""
    if not (os.environ.get("SUBMITIT_EXECUTOR") and os.environ.get("SUBMITIT_FOLDER")):  # a submitit job sets both
        return None
    import submitit

    paths = submitit.JobEnvironment().paths
    return [str(paths.stdout), str(paths.stderr)]


def read_status(out_dir: str | Path) -> dict | None:
    """A job's ``status.json``, or ``None`` when it wrote none (yet)."""
    try:
        return read_job_status(out_dir)
    except StatusError:
        return None


def record_entry(out_dir: str | Path, **fields) -> None:
    """Set ``fields`` in this job's entry of its sweep's ``sweep.json`` (none: a sweep without one);
    a disk that refuses it leaves the entry to ``sweep_record.reconcile``."""
    from runner.store.sweep_record import find_sweep, update_job

    try:
        sweep_dir = find_sweep(out_dir)
        if sweep_dir is not None:
            update_job(sweep_dir, out_dir, **fields)
    except OSError as exc:
        log.warning("sweep.json not updated for '%s': %s", out_dir, exc)
