"""The command line, checked before Hydra runs: every mistake is one line and status 2, nothing written.

``check_command_line`` takes every job of the command composed, its choices checked against the
registries (``runner.cli.early``: no torch imported, so a typo is answered at once), and compiles
each job's plan, unless the command's fixed directory already holds its run(s): that one line comes
first, before any plan is compiled (``runner.cli.taken_dirs``); a bad job rejects the whole command
before Hydra creates any directory. It returns the plans with the problems: ``runner.__main__``
hands each job its plan, so a run is composed, checked, built and rehearsed once by the check. A
sweep's jobs that differ from its first in values only are derived from the first's config rather
than composed again (``runner.cli.sweep_compile``), and share its meta model
(``runner.engine.plan_cache``); each is still compiled and rehearsed in full.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from runner.cli.early import ComposedCommand, compose_command_line
from runner.cli.taken_dirs import held_run_dir
from runner.cli.resume import resume_mode
from runner.config.compose import CONF_DIR
from runner.engine.fsdp import sweep_problem
from runner.engine.plan import Plan, compile_plan
from runner.engine.plan_cache import shared_meta_models


@dataclass
class CommandCheck:
    """What checking a command line found: its problems (one line each), and each job's plan by its config."""

    problems: list[str] = field(default_factory=list)
    plans: dict[str, Plan] = field(default_factory=dict)

    def plan_for(self, cfg: DictConfig) -> Plan | None:
        """The plan compiled for the job whose composed config is ``cfg`` (each job takes its own once)."""
        return self.plans.pop(OmegaConf.to_yaml(cfg), None)


def check_command_line(argv: Sequence[str], composed: ComposedCommand | None = None) -> CommandCheck:
    """Check every job of ``python -m runner ARGV`` and compile its plan; ``composed``: the command
    ``compose_command_line(argv)`` gave already (``runner.__main__``), else it is composed here."""
    command = composed or compose_command_line(argv)
    if command.other_mode or command.problems:
        return CommandCheck(command.headed())
    held = _may_be_taken(command) and held_run_dir(command.first_with_hydra, command.jobs, command.multirun)
    if held:  # the same command run again: said before any of its plans is compiled
        return CommandCheck(held)
    checked = CommandCheck()
    with shared_meta_models():  # a sweep's model is not built again on the meta device for each job
        for num, job in enumerate(command.composed):
            if command.multirun and (problem := sweep_problem(job.config)):  # the same for every job: said once
                return CommandCheck([problem])
            try:
                checked.plans[OmegaConf.to_yaml(job.config)] = compile_plan(job.config, job.overrides,
                                                                              check_device=not job.remote)
            except ConfigError as exc:
                command.reject(num, job.overrides, str(exc))
    checked.problems = command.headed()
    return checked


def _may_be_taken(command: ComposedCommand) -> bool:
    """Whether the command's directories may hold its run(s) already, so that looking there (one
    job directory per job of a sweep) is worth it: not when they are ``conf/config.yaml``'s own,
    which name the moment they are made (``${now:...}``), and the command resumes nothing."""
    if any(job.lstrip("+~").startswith("hydra") for job in command.jobs[0]):
        return True  # a directory, a search path or a launcher of the command's own
    try:
        if resume_mode(command.composed[0].config):
            return True
    except ConfigError:
        return True  # held_run_dir says why
    dirs = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False).get("hydra", {})
    return not all("${now:" in str((dirs.get(part) or {}).get("dir", "")) for part in ("run", "sweep"))
