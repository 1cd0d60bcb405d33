"""``hydra/launcher=slurm`` and ``slurm_cpu``: Hydra's submitit Slurm launcher, reporting like the runner.

Upstream's ``launch`` submits the job array and then collects ``[job.results()[0] for job in jobs]``
in order, so sbatch's refusal is a traceback, a sweep whose jobs fit no node waits forever, and a
job the scheduler ends (``scancel``, time limit) raises in the submitting process while later jobs
still run, before the sweep's closing report. Here the same submission is followed by a wait on
every job: sbatch's error is one line naming the launcher key (status 2, nothing run), a sweep
none of whose jobs can be scheduled is cancelled with the reason (``unschedulable_after_s``), and a
job that ended without a result gets a ``status.json`` and its ``sweep.json`` entry with its run
state (``cancelled``, ``timeout``, ``failed``: ``write_status``) so that ``on_multirun_end`` lists it. Jobs run upstream's ``__call__``
and are requeued through upstream's ``checkpoint`` on preemption and timeout.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as UpstreamSlurmLauncher
from omegaconf import OmegaConf

from runner.cli.exit_codes import EXIT_CONFIG_ERROR
from runner.cli.job_files import job_dir, read_status, write_status  # no torch: Hydra imports this plugin to compose
from runner.cli.scheduler import (UNSCHEDULABLE, PendingWatch, parse_squeue, run_state, sbatch_error, stuck_error,
                                  trace_error)

log = logging.getLogger(__name__)

#: Seconds between two looks at the queue (the first minute), then at most ``_POLL_MAX_S``.
_POLL_S, _POLL_MAX_S = 2.0, 30.0


class SlurmLauncher(UpstreamSlurmLauncher):
    def __init__(self, unschedulable_after_s: float | None = None, unschedulable_reasons: Sequence[str] = UNSCHEDULABLE,
                 **params: Any) -> None:
        super().__init__(**params)
        self.unschedulable_after_s = unschedulable_after_s
        self.unschedulable_reasons = list(unschedulable_reasons)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        executor = self._executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's stderr: the error says it
                jobs = executor.map_array(self, *zip(*params))
        except submitit.core.utils.FailedJobError as exc:
            _exit(sbatch_error(str(exc), self.params))
        self._wait(jobs)
        return [self._result(job, p[0], p[2]) for job, p in zip(jobs, params)]

    def _executor(self):
        """Upstream's executor and parameters (``launch`` builds them inline there)."""
        import submitit

        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(cluster="slurm", folder=self.params["submitit_folder"],
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in self.params.items()
                                      if k not in init_keys})
        return executor

    def _wait(self, jobs) -> None:
        """Until every job ended; cancel the sweep when none of its jobs can be scheduled."""
        watch = PendingWatch(self.unschedulable_after_s, self.unschedulable_reasons)
        start = time.monotonic()
        array = jobs[0].job_id.split("_")[0]
        while True:
            queued = _squeue(array)
            # a job that left the queue without a result (scancel, time limit): ask sacct now, not at its next poll
            if all(job.done(force_check=queued is not None and job.job_id not in queued) for job in jobs):
                return
            reason = watch.stuck(queued or {}, time.monotonic())
            if reason:
                for job in jobs:
                    job.cancel(check=False)
                _exit(stuck_error(reason, time.monotonic() - watch.since, self.params))
            time.sleep(min(_POLL_S + (time.monotonic() - start) / 30, _POLL_MAX_S))

    def _result(self, job, overrides: list[str], num: int) -> JobReturn:
        """The job's return; for a job Slurm ended without one, a ``status.json`` saying how."""
        import submitit

        try:
            return job.results()[0]
        except submitit.core.utils.UncompletedJobError as exc:
            out_dir = job_dir(self.config, num, overrides)
            if (read_status(out_dir) or {}).get("status") in (None, "requeued"):  # else the job said how it ended
                slurm = job.state
                if isinstance(exc, submitit.core.utils.FailedJobError):  # raised in the job
                    state, why = "failed", trace_error(str(exc))
                else:
                    state, why = run_state(slurm), f"Slurm state {slurm}"
                write_status(out_dir, overrides, f"{state} (job {job.job_id}): {why}", state=state)
            return JobReturn(overrides=overrides, status=JobStatus.COMPLETED)  # status.json reports it


def _squeue(array: str) -> dict[str, tuple[str, str]] | None:
    """``{job id: (state, reason)}`` of the array's jobs still pending or running; ``None`` if squeue failed."""
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-j", array, "-t", "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING",
                               "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_squeue(proc.stdout) if proc.returncode == 0 else None


def _exit(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)
