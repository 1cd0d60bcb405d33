"""The output directories of a command: where each job writes, and the one line refusing a sweep
directory that already holds the same sweep.

Shared by the command-line check (``runner.cli.commandline``), which refuses a taken fixed
directory before it compiles any job's plan, and Hydra's callback (``runner.cli.callbacks``),
which checks every job's directory again just before Hydra writes into it.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from omegaconf import DictConfig

from common.errors import ConfigError, OutputError
from runner.cli.execute import failure_code
from runner.cli.job_files import job_dirs
from runner.cli.resume import command_problem, resume_mode, unfinished_jobs
from runner.store.claim import CompleteRunError, check_output_dir, refuse_complete_run
from common.sweep_format import FAILED, read_record


def sweep_dir_problems(config: DictConfig, jobs: Sequence[Sequence[str]], skip: Collection[int] = ()
                       ) -> tuple[str | None, list[str], int]:
    """Why the sweep of ``jobs`` cannot write its job directories: ``(headline, lines, exit status)``.

    A directory whose every refused job holds a complete run is the same sweep run again: one
    headline, no per-job lines. No problem: ``(None, [], 0)``. The jobs ``skip`` (those a resumed
    sweep keeps) write nothing and are not checked.
    """
    bad, code, complete = [], 0, 0
    checked = [num for num in range(len(jobs)) if num not in skip]
    for num, out_dir in zip(checked, job_dirs(config, [(num, jobs[num]) for num in checked])):
        overrides = jobs[num]
        try:
            check_output_dir(out_dir, bool(config.get("overwrite")))
        except (ConfigError, OutputError) as exc:
            bad.append(f"job {num} ({' '.join(overrides)}): {exc}")
            code = max(code, failure_code(exc))
            complete += isinstance(exc, CompleteRunError)
    if bad and complete == len(bad):
        headline, *unfinished = held_sweep_lines(config, complete, len(jobs))
        return headline, unfinished, code
    if bad:
        return f"sweep rejected before any job ran: {len(bad)} of {len(jobs)} jobs are invalid", bad, code
    return None, [], 0


def held_sweep_lines(config: DictConfig, held: int, jobs: int) -> list[str]:
    """The line refusing a sweep whose ``held`` of ``jobs`` job directories hold a complete run, then one
    line for each job its ``sweep.json`` lists as not complete (``unfinished_jobs``): the same command
    run again is told which jobs failed, and how ``resume`` treats them."""
    record = read_record(str(config.hydra.sweep.dir))
    unfinished = unfinished_jobs(record["jobs"]) if record else []
    listed = f"; {len(unfinished)} did not complete, listed below" if unfinished else ""
    failed = any(job["state"] == FAILED for job in record["jobs"]) if record else False
    rerun = "; resume=failed runs its failed ones again too" if failed else ""
    return [f"overwrite: '{config.hydra.sweep.dir}' already holds a sweep ({held} of {jobs} job directories hold "
            f"a complete run{listed}); pass resume=true to continue it (its complete jobs are kept{rerun}), "
            f"overwrite=true to replace it, or choose another hydra.sweep.dir", *unfinished]


def held_run_dir(config: DictConfig, jobs: Sequence[Sequence[str]], multirun: bool) -> list[str]:
    """The lines refusing a command whose directory already holds its complete run(s), else ``[]``.

    ``config`` is the first job's, Hydra's node included. Only a complete run is looked for here
    (``refuse_complete_run``); the rest of a directory's check (read-only, full, a live run) is Hydra's
    callback's, once, after the configs are checked. A command with ``resume`` is checked against
    the sweep it resumes instead (``runner.cli.resume.command_problem``).
    """
    try:
        if resume_mode(config):
            problem = command_problem(config, jobs, multirun)
            return [problem] if problem else []
    except ConfigError as exc:
        return [str(exc)]
    overwrite = bool(config.get("overwrite"))
    if multirun:
        held = [out_dir for out_dir in job_dirs(config, enumerate(jobs)) if _holds_run(out_dir, overwrite)]
        return held_sweep_lines(config, len(held), len(jobs)) if held else []
    if config.get("plan"):
        return []  # a plan writes nothing
    try:
        refuse_complete_run(Path(str(config.hydra.run.dir)), overwrite)
    except CompleteRunError as exc:
        return [str(exc)]
    return []


def _holds_run(out_dir: Path, overwrite: bool) -> bool:
    try:
        refuse_complete_run(out_dir, overwrite)
    except CompleteRunError:
        return True
    return False
