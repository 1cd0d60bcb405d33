"""The command line read before torch is imported: what it asks for, and each job composed and its choices checked.

``compose_command_line`` expands a sweep, composes every job with Hydra against the real schemas,
stored by modules importing no torch (``runner.config.compose``), and looks each job's choices up in
the registries (``runner.cli.choices``).
A mistake there (a key, a type, a preset, a hook type, a model, ...) is the one line the full check
would give, said at the cost of importing Hydra. Otherwise the composed jobs go on to
``runner.cli.commandline.check_command_line``, which compiles each job's plan (torch) without
composing it again.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig

from common.errors import ConfigError
from runner.cli.choices import check_choices
from runner.cli.sweep_compile import JobComposer
from runner.config.compose import LauncherError, parse_error

#: The key asking for a replay: ``python -m runner replay=RUN_DIR`` (``runner.cli.replay``).
REPLAY_KEY = "replay"
#: Flags after which Hydra does something else than run jobs (help, print the config, ...).
_OTHER_MODES = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-p", "--package",
                "--resolve", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name",
                "-cd", "--config-dir", "--experimental-rerun")


def is_replay(argv: Sequence[str]) -> bool:
    """Whether the command line asks for a replay (``replay=...`` anywhere in it)."""
    return any(arg.split("=", 1)[0] == REPLAY_KEY for arg in argv)


@dataclass
class ComposedJob:
    """One job of the command: its overrides, its composed config, whether its launcher runs it elsewhere,
    and the composition whose ``hydra`` node it runs under (``runner.cli.checked_jobs``)."""

    overrides: list[str]
    config: DictConfig
    remote: bool
    with_hydra: DictConfig
    #: derived from the first job's config by replacing values (``runner.cli.sweep_compile``): that config and them
    replaced: tuple[DictConfig, tuple[tuple[str, object], ...]] | None = None


@dataclass
class ComposedCommand:
    """The command's jobs, composed and their choices checked, or its problems (one line each)."""

    jobs: list[list[str]] = field(default_factory=list)
    multirun: bool = False
    overrides: list[str] = field(default_factory=list)  #: as given, a sweep's unexpanded (``-m`` left out)
    composed: list[ComposedJob] = field(default_factory=list)
    #: the first job's config with Hydra's node (its directories), as composed for the check
    first_with_hydra: DictConfig | None = None
    problems: list[str] = field(default_factory=list)
    other_mode: bool = False  #: Hydra prints help or a config: nothing is checked

    def reject(self, num: int, job: Sequence[str], problem: str) -> None:
        """Record job ``num``'s problem, labelled with its overrides in a sweep."""
        label = " ".join(o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/")))
        self.problems.append(f"job {num} ({label}): {problem}" if self.multirun else problem)

    def headed(self) -> list[str]:
        """The problems, under the line saying how many of a sweep's jobs are invalid."""
        if self.multirun and self.problems:
            return [f"sweep rejected before any job ran: {len(self.problems)} of {len(self.jobs)} jobs are invalid",
                    *self.problems]
        return self.problems


def compose_command_line(argv: Sequence[str]) -> ComposedCommand:
    """Every job of ``python -m runner ARGV`` composed and its choices checked (no torch imported)."""
    if any(arg.split("=")[0] in _OTHER_MODES for arg in argv):
        return ComposedCommand(other_mode=True)
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    overrides = [arg for arg in argv if arg not in ("-m", "--multirun")]
    command = ComposedCommand(multirun=multirun, overrides=overrides)
    try:
        command.jobs = expand(overrides) if multirun else [overrides]
    except ConfigError as exc:
        return ComposedCommand(problems=[str(exc)])
    composer = JobComposer()  # a job differing from the first in values only is not composed again
    for num, job in enumerate(command.jobs):
        try:
            composition = composer.compose(job)
            check_choices(composition.config)
        except LauncherError as exc:  # the same for every job: said once
            return ComposedCommand(problems=[str(exc)])
        except ConfigError as exc:
            command.reject(num, job, str(exc))
            continue
        command.composed.append(ComposedJob(job, *composition))
    command.first_with_hydra = composer.first_with_hydra
    return command


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
