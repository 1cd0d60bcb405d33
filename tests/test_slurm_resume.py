"""A Slurm sweep one of whose running array tasks is cancelled with ``scancel`` names that job
wherever it is read, and the same command with ``resume=true`` finishes it: the cancelled job runs
again, the complete ones are kept (not run again), and the tables are an uninterrupted sweep's.

Run with ``python -m pytest -q -m slurm tests/test_slurm_resume.py`` (the cluster: ``slurm_cluster``).
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pandas as pd
import pytest

import runner.analysis as analysis
from runner.analysis.report import render
from runner.analysis.sweep_jobs import IncompleteSweepWarning
from common.sweep_format import OK, PENDING, RUNNING, read_record
from slurm_cluster import array_id, sh, slurm, submit  # noqa: F401  (slurm: the cluster fixture)
from sweep_checks import tables, wait_for

pytestmark = pytest.mark.slurm

#: Steps of the job that is cancelled: enough to be still running when Slurm kills it, KillWait=5 s
#: after ``scancel`` (submitit ignores the SIGTERM before). Measured: 3,000 steps take ~7 s here.
LONG = 10000
#: Four jobs of a small MLP; job 1 runs ``LONG`` steps, the others a few.
JOBS = f"model=mlp hooks=stats steps=2,{LONG},3,4"
SLURM = "hydra/launcher=slurm_cpu hydra.launcher.partition=debug"
KEPT = [0, 2, 3]


@pytest.fixture
def uninterrupted(tmp_path):
    """The same jobs on the basic launcher, running beside the test (stopped if it fails first)."""
    proc = submit(f"python -m runner -m {JOBS}", tmp_path / "plain")
    yield proc
    proc.kill()
    proc.communicate()


def test_a_scancelled_array_task_is_named_and_resume_true_runs_it_alone(slurm, uninterrupted, tmp_path):
    sweep, plain = tmp_path / "sweep", tmp_path / "plain"
    proc = submit(f"python -m runner -m {SLURM} {JOBS}", sweep)
    started = wait_for(sweep, lambda jobs: jobs[1]["state"] != PENDING, timeout=300)
    assert started[1]["state"] == RUNNING, started[1]  # not over yet: LONG is long enough
    array = array_id(sweep)
    assert sh(f"scancel {array}_1").returncode == 0
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    why = f"cancelled (job {array}_1): Slurm state CANCELLED by 0"
    *_, head, last = err.strip().splitlines()
    assert head == "error: 1 of 4 jobs failed:"
    assert last.startswith(f"error: job 1 (model=mlp hooks=stats steps={LONG}): {why}; its "), last

    state = analysis.sweep_state(sweep)
    assert state[["num", "overrides", "state"]].values.tolist() == [
        [0, "steps=2", OK], [1, f"steps={LONG}", "cancelled"], [2, "steps=3", OK], [3, "steps=4", OK]]
    assert state.error[1] == why and state.error.drop(1).isna().all()
    assert analysis.failed_jobs(sweep).values.tolist() == [
        [str(sweep / "1"), f"model=mlp hooks=stats steps={LONG}", f"cancelled: {why}"]]
    line = f"4 jobs: 3 complete, 1 cancelled (job 1: steps={LONG})"
    assert f"sweep {sweep}: {line}" in out.splitlines()
    with pytest.warns(IncompleteSweepWarning, match=f"^{re.escape(f'{sweep}: {line}; reading the 3 complete run(s)')}$"):
        analysis.load_stats(sweep)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert f'<p class="bad">Not complete: {line}.</p>' in render(sweep)

    manifests = {num: _manifest(sweep, num) for num in KEPT}
    proc = submit(f"python -m runner -m {SLURM} {JOBS} resume=true", sweep)  # the README's command
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert {num: _manifest(sweep, num) for num in KEPT} == manifests  # kept, not run again
    assert read_record(sweep)["kept"] == KEPT
    resumed = array_id(sweep)
    assert resumed != array
    for num in range(4):  # each job says in its Slurm log whether it was kept
        kept = f"kept {sweep / str(num)}: complete before the sweep was resumed" in _log(sweep, f"{resumed}_{num}")
        assert kept == (num in KEPT), num
    assert analysis.sweep_state(sweep)["state"].tolist() == [OK] * 4
    assert analysis.failed_jobs(sweep).empty

    _, err = uninterrupted.communicate(timeout=600)
    assert uninterrupted.returncode == 0, err
    for got, want in zip(tables(sweep), tables(plain)):
        assert len(got) > 0
        pd.testing.assert_frame_equal(got, want)


def _manifest(sweep: Path, num: int) -> tuple[bytes, int]:
    path = sweep / str(num) / "manifest.json"
    return path.read_bytes(), path.stat().st_mtime_ns


def _log(sweep: Path, job: str) -> str:
    """What Slurm job ``job`` (``ARRAY_TASK``) printed: submitit's ``SWEEP/.submitit/JOB/JOB_0_log.out``."""
    return (sweep / ".submitit" / job / f"{job}_0_log.out").read_text()
