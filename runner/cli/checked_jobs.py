"""Hydra runs the jobs the command line's check composed: each job is composed once, by the check.

``hydra.main`` would compose the command again before a single job ran (once to read the run mode,
once for the run or the sweep's primary config) and its launcher each job of a sweep once more
(``ConfigLoader.load_sweep_config``), none of which its public API lets a caller skip. Here Hydra's
own pieces run the jobs, handed the configs the check composed: its callbacks (``hydra.callbacks``),
its sweeper and launcher plugins (``hydra/sweeper``, ``hydra/launcher``: basic, Slurm, ...) and
``run_job`` (the job's directory, ``.hydra/``, its logging). The launcher asks ``CheckedConfigs``, the
``ConfigLoader`` it is given, for each job's config: that is the check's composition of that job,
under the ``hydra`` node of the composition it came from, with the job's own task overrides (a job
derived from the first, ``runner.cli.sweep_compile``, differs from it in values only). A job the check
did not compose is ``UncheckedJob``, said loudly, never composed in silence.

A sweep's primary config (``multirun.yaml``, the sweep callbacks' ``config``) is its first job's under
``hydra.mode=MULTIRUN`` with the command's task overrides: where Hydra's leaves a swept key at its
default, it holds the first job's value.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hydra._internal.callbacks import Callbacks  # Hydra has no public one: what hydra.main calls
from hydra.core.config_loader import ConfigLoader
from hydra.core.plugins import Plugins
from hydra.core.utils import JobRuntime, configure_log, run_job, setup_globals
from hydra.types import HydraContext, RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from runner.cli.early import ComposedJob
from runner.cli.job_files import name_job
from runner.cli.override_lines import parsed


class UncheckedJob(RuntimeError):
    """Hydra runs a job the command line's check did not compile: a bug in the runner, never a user's mistake."""


def settings_of(overrides: Sequence[str]) -> dict:
    """What a job's overrides set, hydra's own left out, as Hydra parses them (so ``x=[1, 2]`` is ``x=[1,2]``)."""
    return {(o.type, o.package, o.key_or_group): o.value() for o in parsed(overrides) if not o.is_hydra_override()}


def with_hydra(job: ComposedJob, task: Sequence[str], mode: RunMode) -> DictConfig:
    """``job``'s config under the ``hydra`` node it runs under, as Hydra's composition of ``task`` (the
    task overrides, hydra's own left out) under ``mode`` would hold it: ``hydra.overrides.task`` and
    ``hydra.job.override_dirname`` are the ones of ``task``, ``hydra.mode`` is ``mode`` and, as ``hydra.main``
    adds it, ``hydra.mode=MODE`` is among ``hydra.overrides.hydra``. A copy: the job's checked config stays
    as it was."""
    cfg = copy.deepcopy(job.config)
    node = copy.deepcopy(job.with_hydra.hydra)
    name_job(node, task)
    with read_write(node), open_dict(node):
        node.mode = mode
        if f"hydra.mode={mode.name}" not in node.overrides.hydra:
            node.overrides.hydra.append(f"hydra.mode={mode.name}")
    with open_dict(cfg):
        cfg.hydra = node
    return cfg


def task_overrides(overrides: Sequence[str]) -> list[str]:
    """The lines of ``overrides`` that are not Hydra's own (``hydra.overrides.task``), in their order."""
    return [o.input_line for o in parsed(overrides) if not o.is_hydra_override()]


class CheckedConfigs(ConfigLoader):
    """The ``ConfigLoader`` Hydra's sweeper and launcher are given: each job's config is the check's.

    Launchers ask ``load_sweep_config`` for each job; nothing of the runner's asks anything else, so the
    rest of the interface says so (``UncheckedJob``) rather than composing in silence.
    """

    def __init__(self, jobs: Sequence[ComposedJob]) -> None:
        self.jobs = list(jobs)
        self._settings: list[dict] | None = None  # each job's, parsed when a launcher first asks

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """The check's config of the job ``sweep_overrides`` set, the primary config's resolved values
        (``${now:...}``) kept, as Hydra's own ``load_sweep_config`` keeps them."""
        if self._settings is None:
            self._settings = [settings_of(job.overrides) for job in self.jobs]
        wanted = settings_of(sweep_overrides)
        job = next((job for job, settings in zip(self.jobs, self._settings) if settings == wanted), None)
        if job is None:
            raise UncheckedJob(f"a job of overrides {' '.join(sweep_overrides)} is not one the command line's "
                               f"check composed; nothing of it was run")
        cfg = with_hydra(job, task_overrides(sweep_overrides), master_config.hydra.mode)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    def _composes(self, *args: Any, **kwargs: Any) -> Any:
        raise UncheckedJob("Hydra asked to compose a config: the runner's jobs are composed by the command "
                           "line's check alone (runner.cli.checked_jobs)")

    load_configuration = get_search_path = get_sources = list_groups = get_group_options = _composes
    compute_defaults_list = _composes


def run_checked(jobs: Sequence[ComposedJob], multirun: bool, sweep: Sequence[str], task: TaskFunction) -> None:
    """Run ``task`` on each checked job as ``hydra.main`` runs it: a single run (``jobs[0]``), or the sweep
    of the task overrides ``sweep`` through the configured sweeper and launcher.

    Raises:
        Exception: a single run's job raised (Hydra's ``run`` raises it too: a traceback and status 1).
    """
    setup_globals()
    primary = with_hydra(jobs[0], task_overrides(sweep), RunMode.MULTIRUN if multirun else RunMode.RUN)
    configure_log(primary.hydra.hydra_logging, primary.hydra.verbose)
    JobRuntime.instance().set("name", primary.hydra.job.name)
    callbacks = Callbacks(primary)
    context = HydraContext(config_loader=CheckedConfigs(jobs), callbacks=callbacks)
    name = primary.hydra.job.config_name
    if not multirun:
        callbacks.on_run_start(config=primary, config_name=name)
        ret = run_job(task_function=task, config=primary, job_dir_key="hydra.run.dir", job_subdir_key=None,
                      hydra_context=context)
        callbacks.on_run_end(config=primary, config_name=name, job_return=ret)
        _ = ret.return_value  # a failed job raises here
        return
    callbacks.on_multirun_start(config=primary, config_name=name)
    sweeper = Plugins.instance().instantiate_sweeper(config=primary, hydra_context=context, task_function=task)
    sweeper.sweep(arguments=list(primary.hydra.overrides.task))
    callbacks.on_multirun_end(config=primary, config_name=name)
