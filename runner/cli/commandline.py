"""The command line, checked before Hydra runs: every mistake is one line and status 2, nothing written.

``check_command_line`` composes every job of the command (a sweep's too) with
``runner.config.compose`` (Hydra's errors as the runner's one line) and compiles each job's
plan, unless the command's fixed directory already holds its run(s): that one line comes first,
before any plan is compiled (``runner.cli.taken_dirs``); a bad job rejects the whole command before Hydra creates any directory. It returns the
plans with the problems: ``runner.__main__`` hands each job its plan, so a run is checked,
built and rehearsed once. A sweep's jobs that differ from its first in values only are derived
from the first's config rather than composed again (``runner.cli.sweep_compile``), and share its
meta model (``runner.engine.plan_cache``); each is still compiled and rehearsed in full.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from runner.config.compose import LauncherError, compose_with_hydra, parse_error
from runner.cli.sweep_compile import JobComposer
from runner.cli.taken_dirs import held_run_dir
from runner.engine.fsdp import sweep_problem
from runner.engine.plan import Plan, compile_plan
from runner.engine.plan_cache import shared_meta_models

#: Flags after which Hydra does something else than run jobs (help, print the config, ...).
_OTHER_MODES = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-p", "--package",
                "--resolve", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name",
                "-cd", "--config-dir", "--experimental-rerun")


@dataclass
class CommandCheck:
    """What checking a command line found: its problems (one line each), and each job's plan by its config."""

    problems: list[str] = field(default_factory=list)
    plans: dict[str, Plan] = field(default_factory=dict)

    def plan_for(self, cfg: DictConfig) -> Plan | None:
        """The plan compiled for the job whose composed config is ``cfg`` (each job takes its own once)."""
        return self.plans.pop(OmegaConf.to_yaml(cfg), None)


def check_command_line(argv: Sequence[str]) -> CommandCheck:
    """Check every job of ``python -m runner ARGV`` and compile its plan."""
    checked = CommandCheck()
    if any(arg.split("=")[0] in _OTHER_MODES for arg in argv):
        return checked
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    overrides = [arg for arg in argv if arg not in ("-m", "--multirun")]
    try:
        jobs = expand(overrides) if multirun else [overrides]
    except ConfigError as exc:
        return CommandCheck([str(exc)])
    held = _held_dir(jobs, multirun)
    if held:  # the same command run again: said before any of its plans is compiled
        return CommandCheck([held])
    composer = JobComposer()  # a job differing from the first in values only is not composed again
    with shared_meta_models():  # nor is its model built again on the meta device
        for num, job in enumerate(jobs):
            try:
                cfg, remote = composer.compose(job)
                if multirun and (problem := sweep_problem(cfg)):  # the same for every such job: said once
                    return CommandCheck([problem])
                checked.plans[OmegaConf.to_yaml(cfg)] = compile_plan(cfg, job, check_device=not remote)
            except LauncherError as exc:  # the same for every job: said once
                return CommandCheck([str(exc)])
            except ConfigError as exc:
                label = " ".join(o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/")))
                checked.problems.append(f"job {num} ({label}): {exc}" if multirun else str(exc))
    if multirun and checked.problems:
        checked.problems.insert(0, f"sweep rejected before any job ran: {len(checked.problems)} of {len(jobs)} jobs "
                                   f"are invalid")
    return checked


def _held_dir(jobs: Sequence[Sequence[str]], multirun: bool) -> str | None:
    """The one line refusing a fixed directory that already holds this command's run(s), else ``None``."""
    try:
        config = compose_with_hydra(jobs[0])
    except ConfigError:
        return None  # the jobs' own checks say it
    return held_run_dir(config, jobs, multirun)


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """The jobs of a sweep: the cartesian product of every sweep override, in Hydra's basic sweeper order."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise ConfigError(parse_error(exc)) from None
    choices = []
    for override in parsed:
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


