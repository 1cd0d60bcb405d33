"""The command line, checked before Hydra runs: every mistake is one line and status 2, nothing written.

``check_command_line`` takes every job of the command composed, its choices checked against the
registries (``runner.cli.early``: no torch imported, so a typo is answered at once), and compiles
each job's plan, unless the command's fixed directory already holds its run(s): that one line comes
first, before any plan is compiled (``runner.cli.taken_dirs``); a bad job rejects the whole command
before Hydra creates any directory. It returns the plans with the problems, in the jobs' order:
``runner.__main__`` hands Hydra's job number ``N`` the plan object of the check's job ``N`` (the
sweep's order, which ``runner.cli.early.expand`` shares with Hydra's sweeper), once its overrides
are found the same; a job the check did not compile is an error said loudly, never compiled again
in silence. So a run is composed, checked, built and rehearsed once by the check. A
sweep's jobs that differ from its first in values only are derived from the first's config rather
than composed again (``runner.cli.sweep_compile``), and share its meta model
(``runner.engine.plan_cache``); each is still compiled and rehearsed in full.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.rundir import shared_reads
from runner.cli.checked_jobs import UncheckedJob, settings_of
from runner.cli.early import ComposedCommand, ComposedJob, compose_command_line
from runner.cli.taken_dirs import held_run_dir
from runner.cli.resume import resume_mode
from runner.engine.fsdp import sweep_problem
from runner.engine.plan import Plan, Replaced, compile_plan, schema_merged
from runner.engine.plan_cache import shared_meta_models


@dataclass
class CommandCheck:
    """What checking a command line found: its problems (one line each), and each job's plan in the jobs' order."""

    problems: list[str] = field(default_factory=list)
    #: each job's overrides and its plan, by job number (``hydra.job.num``; 0 for a single run)
    plans: list[tuple[list[str], Plan | None]] = field(default_factory=list)
    #: the command as composed: its jobs' configs, which Hydra runs (``runner.cli.checked_jobs``)
    command: ComposedCommand | None = None

    def plan_for(self, num: int, task_overrides: Sequence[str]) -> Plan:
        """The plan the check compiled for job ``num``, whose overrides Hydra gives as ``task_overrides``
        (``hydra.overrides.task``). The plan stays: a job submitit requeues after a preemption runs again from
        the state its process pickled, and asks for the same plan (a frozen ``Plan``; the run resumes from its own
        resume point).

        Raises:
            UncheckedJob: the check has no plan for that job, or compiled it from other overrides.
        """
        overrides, plan = self.plans[num] if 0 <= num < len(self.plans) else (None, None)
        if plan is None or settings_of(overrides) != settings_of(task_overrides):
            raise UncheckedJob(f"job {num} ({' '.join(task_overrides)}) is not the job the command line's check "
                               f"compiled ({' '.join(overrides or ['none'])}); nothing of it was run")
        return plan


def check_command_line(argv: Sequence[str], composed: ComposedCommand | None = None) -> CommandCheck:
    """Check every job of ``python -m runner ARGV`` and compile its plan; ``composed``: the command
    ``compose_command_line(argv)`` gave already (``runner.__main__``), else it is composed here."""
    command = composed or compose_command_line(argv)
    if command.other_mode or command.problems:
        return CommandCheck(command.headed())
    held = _may_be_taken(command) and held_run_dir(command.first_with_hydra, command.jobs, command.multirun)
    if held:  # the same command run again: said before any of its plans is compiled
        return CommandCheck(held)
    checked = CommandCheck(command=command)
    merged: dict[int, DictConfig | None] = {}  # the first job's config merged into the schema, once
    with shared_meta_models(), shared_reads():  # a sweep's model is built, and its stored runs read, once
        for num, job in enumerate(command.composed):
            if command.multirun and (problem := sweep_problem(job.config)):  # the same for every job: said once
                return CommandCheck([problem])
            try:
                checked.plans.append((job.overrides, compile_plan(job.config, job.overrides, check_device=not job.remote,
                                                                  replaced=_replaced(job, merged))))
            except ConfigError as exc:
                command.reject(num, job.overrides, str(exc))
                checked.plans.append((job.overrides, None))  # job numbers stay Hydra's
    checked.problems = command.headed()
    return checked


def _replaced(job: ComposedJob, merged: dict[int, DictConfig | None]) -> Replaced | None:
    """A derived job's ``Replaced``: the config it was derived from merged into the schema (once, kept in
    ``merged`` by that config), and the values it replaced there; ``None`` for a job Hydra composed."""
    if job.replaced is None:
        return None
    first, values = job.replaced
    if id(first) not in merged:
        merged[id(first)] = schema_merged(first)
    return None if merged[id(first)] is None else Replaced(merged[id(first)], values)


def _may_be_taken(command: ComposedCommand) -> bool:
    """Whether the command's directories may hold its run(s) already, so that looking there (one
    job directory per job of a sweep) is worth it: not when they are ``conf/config.yaml``'s own,
    which name the moment they are made (``${now:...}``), and the command resumes nothing (read in the
    first job's composition, which holds them as written)."""
    if any(job.lstrip("+~").startswith("hydra") for job in command.jobs[0]):
        return True  # a directory, a search path or a launcher of the command's own
    try:
        if resume_mode(command.composed[0].config):
            return True
    except ConfigError:
        return True  # held_run_dir says why
    dirs = OmegaConf.to_container(command.first_with_hydra.hydra, resolve=False)  # as composed, not resolved
    return not all("${now:" in str((dirs.get(part) or {}).get("dir", "")) for part in ("run", "sweep"))
