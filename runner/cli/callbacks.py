"""Runs and sweeps that fail early and report every failed job: a Hydra callback and status files.

Hydra's basic sweeper only checks that each job's config composes. ``EarlyChecks`` composes every
job's config before the first one runs and applies the runner's own checks to each (keys, hook
entries, loss, selectors against the model built on the meta device, so no weights are
allocated): a sweep with one bad job is rejected, listing every bad job, before it wastes the
night. What can only fail at run time (a NaN with ``on_nonfinite=error``, a full disk) is written
to the job's ``status.json``; the other jobs run on and the sweep ends with a list of the failed
jobs' overrides and a non-zero exit. (Hydra would stop at the first failed job's batch and skip
``on_multirun_end``, so jobs report through files instead of exceptions.)
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from hooks.errors import ConfigError
from runner.cli.execute import EXIT_CONFIG_ERROR, EXIT_RUN_ERROR, STATUS, failure_code
from runner.sources.data import batches
from runner.store.outputs import OutputError, check_output_dir
from runner.engine.rehearsal import rehearse
from runner.engine.loop import check_run, resolve_device
_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def check_job(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """Every check a job would make before its first forward pass, without running it.

    One step is rehearsed on the meta device (shapes only), which resolves selectors and finds
    what fails only during a pass; a model that cannot run that way is checked by the job itself.
    """
    settings = check_run(cfg, overrides)
    resolve_device(cfg.device)
    batches(cfg.data, cfg.model, int(cfg.seed), torch.device("cpu"))
    rehearse(cfg, settings.hooks, settings.loss_fn)


def job_overrides(config: DictConfig) -> list[list[str]] | None:
    """The overrides of every job of this multirun, as the basic sweeper will expand them."""
    if config.hydra.sweeper.get("_target_") != _BASIC_SWEEPER:
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = config.hydra.sweeper.get("params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(lines)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def _report(problems: list[str], headline: str | None, code: int) -> None:
    if headline:
        print(f"error: {headline}", file=sys.stderr)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(code)


class EarlyChecks(Callback):
    """Checks that run before Hydra creates any directory, and the end-of-sweep report.

    A single run is checked (config, selectors, output directory) before Hydra writes ``.hydra/``
    into its directory, so a rejected run, or one refused because the directory holds a complete
    run, leaves that directory as it was. A sweep is rejected when any of its jobs would be.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("plan"):
            return  # a plan reports bad selectors itself, next to the module table
        try:
            check_job(config, list(config.hydra.overrides.task))
            check_output_dir(Path(config.hydra.run.dir), bool(config.overwrite))
        except (ConfigError, OutputError) as exc:
            _report([str(exc)], None, failure_code(exc))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = job_overrides(config)
        if jobs is None:
            return
        loader = GlobalHydra.instance().config_loader()
        bad, code = [], EXIT_CONFIG_ERROR
        for num, overrides in enumerate(jobs):
            try:
                job = loader.load_sweep_config(config, overrides)
                with open_dict(job):
                    job.hydra.job.num = job.hydra.job.id = num
                check_job(job, overrides)
                check_output_dir(Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir), bool(job.overwrite))
            except (ConfigError, OutputError) as exc:
                bad.append(f"job {num} ({' '.join(overrides)}): {exc}")
                code = max(code, failure_code(exc))
            except HydraException:
                continue  # Hydra reports composition errors itself, before launching
        if bad:
            _report(bad, f"sweep rejected before any job ran: {len(bad)} of {len(jobs)} jobs are invalid", code)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        statuses = [json.loads(p.read_text()) for p in sorted(Path(config.hydra.sweep.dir).rglob(STATUS))]
        failed = [s for s in statuses if s["status"] != "ok"]
        if failed:
            _report([f"{' '.join(s['overrides'])}: {s['error']}" for s in failed],
                    f"{len(failed)} of {len(statuses)} jobs failed:", EXIT_RUN_ERROR)
