"""Inside a submitit job the runner leaves the signals to submitit and records what the scheduler did."""
from __future__ import annotations

import json
import signal

import pytest
from submitit.core.utils import UncompletedJobError

import runner.cli.execute as execute_module
from conftest import make_config
from runner.cli.execute import execute
from runner.cli.exit_codes import EXIT_INTERRUPTED
from common.job_status import STATUS
from runner.cli.signals import Terminated, sigterm_raises

OVERRIDES = ["model=linear", "steps=2"]


def _handler(signum, frame):  # stands for submitit's SignalHandler.bypass
    pass


@pytest.mark.parametrize("in_job", [True, False])
def test_sigterm_is_submitits_inside_a_job_and_the_runners_outside(monkeypatch, in_job):
    if in_job:
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    else:
        monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        with sigterm_raises():
            inside = signal.getsignal(signal.SIGTERM)
        assert (inside is _handler) == in_job
        if not in_job:
            with pytest.raises(Terminated), sigterm_raises():
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is _handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def _status(out_dir):
    return json.loads((out_dir / STATUS).read_text())


def test_a_job_submitit_does_not_requeue_after_its_time_limit_ends_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")

    def timed_out(*args, **kwargs):  # what submitit's USR2 handler raises when the job timed out max_num_timeout times
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    monkeypatch.setattr(execute_module, "run", timed_out)
    execute(make_config(*OVERRIDES), tmp_path, OVERRIDES, multirun=True)
    status = _status(tmp_path)
    assert status["status"] == "timeout"
    assert status["error"] == "UncompletedJobError: Job not requeued because: timed-out too many times."


def test_a_requeued_job_says_so_until_its_next_run_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")

    def requeued(*args, **kwargs):  # submitit's handler after `scontrol requeue`
        raise SystemExit(-1)

    real = execute_module.run
    monkeypatch.setattr(execute_module, "run", requeued)
    with pytest.raises(SystemExit):
        execute(make_config(*OVERRIDES), tmp_path, OVERRIDES, multirun=True)
    assert _status(tmp_path)["status"] == "requeued"
    monkeypatch.setattr(execute_module, "run", real)
    execute(make_config(*OVERRIDES), tmp_path, OVERRIDES, multirun=True)
    assert _status(tmp_path) == {"status": "ok", "overrides": OVERRIDES, "error": None}


@pytest.mark.parametrize("signal_error", [KeyboardInterrupt, Terminated], ids=["ctrl-c", "sigterm"])
def test_a_signal_after_a_jobs_commit_keeps_the_job_and_stops_the_sweep(tmp_path, monkeypatch, capsys, signal_error):
    """The run is complete (its manifest committed), so the job is ``ok``; the signal was for the sweep
    too, so the job does not return for the launcher to start the next one (it did, and the sweep ran on)."""
    real = execute_module.run

    def then_signal(*args, **kwargs):
        real(*args, **kwargs)
        raise signal_error()

    monkeypatch.setattr(execute_module, "run", then_signal)
    with pytest.raises((SystemExit, Terminated)) as stopped:
        execute(make_config(*OVERRIDES), tmp_path, OVERRIDES, multirun=True)
    if signal_error is KeyboardInterrupt:
        assert stopped.value.code == EXIT_INTERRUPTED
    assert _status(tmp_path)["status"] == "ok" and (tmp_path / "manifest.json").is_file()
    assert "after the run completed; wrote" in capsys.readouterr().err
