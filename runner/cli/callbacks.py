"""Hydra callbacks: the run directory is checked before Hydra writes into it, a sweep's record is
written before its first job and closed after its last, with the list of its failed jobs.

Hydra calls ``on_run_start`` / ``on_multirun_start`` before it creates any job directory or
writes ``.hydra/`` (the configs themselves were checked, and every job's plan compiled, by
``runner.cli.commandline`` before Hydra started). A run aimed at a directory that holds a
complete run, or that cannot be written, is refused there, so that directory stays as it was.
A sweep that passes writes ``sweep.json`` (``runner.store.sweep_record``): every job ``pending``,
or, with ``resume``, the jobs it keeps (``runner.cli.resume``); each job then updates its own entry
(``runner.cli.execute``), so the file is true when the sweep is stopped. What can only fail at run
time (a NaN with ``on_nonfinite=error``, a full disk) is written to the job's ``status.json`` and
its entry; the other jobs run on and the sweep ends with a list of the failed jobs (number,
overrides, state, error, where its log is: ``runner.cli.resume.unfinished_jobs``) and a non-zero exit. (Hydra skips ``on_multirun_end`` when a job raises, so jobs report through files
instead of exceptions.)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from common.errors import ConfigError
from runner.cli.early import expand
from runner.cli.execute import EXIT_CONFIG_ERROR, EXIT_RUN_ERROR, failure_code, keep_claim
from runner.cli.resume import carried, resume_mode, swept, unfinished_jobs
from runner.cli.summary import print_summary
from runner.cli.job_files import job_dirs
from runner.cli.taken_dirs import sweep_dir_problems
from runner.engine import fsdp
from runner.store.claim import claim_run_dir
from runner.store.outputs import OutputError
from common.sweep_format import OK, PENDING, read_sweep, state_line
from runner.store.sweep_record import finish_sweep, write_sweep


def _report(problems: list[str], headline: str | None, code: int) -> None:
    if headline:
        print(f"error: {headline}", file=sys.stderr)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(code)


class EarlyChecks(Callback):
    """The output directories of a run or of every sweep job, checked before Hydra touches them."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("plan"):
            return  # a plan writes nothing
        if fsdp.sharded_run(config):  # its ranks share the directory: rank 0 claims it once they run (runner.store.ranks)
            problem = fsdp.run_dir_problem(list(config.hydra.overrides.hydra))
            if problem:
                _report([problem], None, EXIT_CONFIG_ERROR)
            return
        try:  # claimed now: Hydra writes .hydra/ there next, and the run is the directory's owner
            keep_claim(claim_run_dir(Path(config.hydra.run.dir), bool(config.overwrite)))
        except (ConfigError, OutputError) as exc:
            _report([str(exc)], None, failure_code(exc))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = expand(list(config.hydra.overrides.task))
        try:
            mode = resume_mode(config)
        except ConfigError as exc:  # said by the command-line check already; here for a sweep started otherwise
            _report([str(exc)], None, EXIT_CONFIG_ERROR)
        previous = read_sweep(config.hydra.sweep.dir) if mode else None
        start = carried(previous, mode) if previous else {}
        kept = {num for num, job in start.items() if job["state"] != PENDING}  # their jobs write nothing
        headline, bad, code = sweep_dir_problems(config, jobs, skip=kept)
        if headline:
            _report(bad, headline, code)
        if config.get("plan"):
            return  # the jobs print their plans and write nothing
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        entries = [{"num": num, "overrides": swept(overrides), "state": PENDING, "error": None,
                    "run_dir": os.path.relpath(out_dir, sweep_dir), **start.get(num, {})}
                   for (num, overrides), out_dir in zip(enumerate(jobs), job_dirs(config, enumerate(jobs)))]
        write_sweep(sweep_dir, entries, command=swept(config.hydra.overrides.task), pid=os.getpid(), kept=sorted(kept))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("plan"):
            return  # the jobs printed their plans and wrote nothing
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = finish_sweep(sweep_dir)
        failed = [job for job in jobs if job["state"] != OK]
        if len(failed) < len(jobs):
            print_summary(sweep_dir, bool(config.get("quiet")))
        if failed:
            print(f"sweep {sweep_dir}: {state_line(jobs)}")
            _report(unfinished_jobs(jobs), f"{len(failed)} of {len(jobs)} jobs failed:", EXIT_RUN_ERROR)

