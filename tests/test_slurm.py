"""Sweeps on a real one-node Slurm cluster (``scripts/slurm-single-node.sh``), run with ``pytest -m slurm``.

The cluster is ``slurm_cluster``'s session fixture (a machine that cannot run Slurm skips these
tests with the script's reason). Every command of the README's "Slurm" part runs here as written
(only the sweep directory is the test's own).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
from common.resume_point import RESUME
from common.sweep_format import SWEEP
from slurm_cluster import ENV, ROOT, SCRIPT, array_id, sh, slurm, submit  # noqa: F401  (slurm: the cluster fixture)

pytestmark = pytest.mark.slurm

#: The README's sweep on the CPU preset (4 jobs).
README_SWEEP = ("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug model=mlp steps=2 "
                "hooks=clip 'hooks.clip={min:-0.1,max:0.1},{min:-0.01,max:0.01}' 'seed=range(0,2)'")
#: Measured, not computed: they differ between any two runs.
TIMINGS = ["wall_time_s", "peak_memory_bytes"]


def _job_id(sweep_dir: Path, num: int) -> str:
    """Job ``num``'s Slurm id: ``ARRAY_num``, or the plain id of a one-job sweep (submitted without an array)."""
    array = array_id(sweep_dir)
    return f"{array}_{num}" if (sweep_dir / ".submitit" / f"{array}_{num}").exists() else array


def _wait_for(path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.5)


def _jobs(sweep_dir: Path) -> dict[int, dict]:
    return {job["num"]: job for job in json.loads((sweep_dir / SWEEP).read_text())["jobs"]}


#: The states of a job Slurm has not finished with yet.
UNSETTLED = {"PENDING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


def _sacct_states(array: str, timeout_s: float = 60) -> list[str]:
    """The jobs' final states by the README's ``sacct`` command (two header lines, then JobID State ExitCode).

    submitit hands the sweep a job's result when the job has written it, a moment before the job's process
    exits, so ``sacct`` can still say RUNNING when the sweep has returned: wait until every job has settled.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        lines = sh(f"sacct -X -j {array} -o JobID,State,ExitCode").stdout.splitlines()[2:]
        states = [line.split()[1].rstrip("+") for line in lines]  # CANCELLED+: "CANCELLED by 0", cut to the column
        if not UNSETTLED & set(states) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def test_the_readme_sweep_runs_four_jobs_on_slurm_cpu_and_loads_as_one_table(slurm, tmp_path):
    proc = submit(README_SWEEP, tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    stats = analysis.load_stats(tmp_path)
    assert stats.run_dir.nunique() == 4
    sizes = stats.groupby(["hooks.clip", "seed"], observed=True).size()  # the symmetric bounds, one text each
    assert len(sizes) == 4 and sizes.nunique() == 1  # every job wrote the same rows
    assert {job["state"] for job in _jobs(tmp_path).values()} == {"ok"}
    assert "slurmd: running" in sh(f"{SCRIPT} status").stdout
    assert _sacct_states(array_id(tmp_path)) == ["COMPLETED"] * 4  # the scheduler's states: sacct


def test_a_job_cancelled_with_scancel_is_listed_cancelled(slurm, tmp_path):
    proc = submit("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug model=mlp "
                  "steps=2,1000000", tmp_path)
    _wait_for(tmp_path / "1" / ".runner.lock")  # job 1 has started its run
    array = array_id(tmp_path)
    assert sh(f"scancel {array}_1").returncode == 0
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert lines[-2] == "error: 1 of 2 jobs failed:"
    assert lines[-1].startswith(f"error: job 1 (model=mlp steps=1000000): cancelled (job {array}_1): "
                                f"Slurm state CANCELLED by 0; its "), lines[-1]
    assert json.loads((tmp_path / "1" / "status.json").read_text())["status"] == "cancelled"
    jobs = _jobs(tmp_path)
    assert (jobs[0]["state"], jobs[1]["state"]) == ("ok", "cancelled")
    assert analysis.failed_jobs(tmp_path).overrides.tolist() == ["model=mlp steps=1000000"]
    assert analysis.load_steps(tmp_path).run_dir.nunique() == 1
    assert sorted(_sacct_states(array)) == ["CANCELLED", "COMPLETED"]


def test_a_preempted_job_is_requeued_and_ends_with_an_uninterrupted_runs_tables(slurm, tmp_path):
    overrides = "model=mlp optimizer=adam hooks=stats steps=3000"  # long enough to be running when preempted
    sweep_dir, plain = tmp_path / "sweep", tmp_path / "plain"
    proc = submit(f"python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug {overrides}",
                  sweep_dir)
    _wait_for(sweep_dir / "0" / ".runner.lock")
    time.sleep(5)  # some steps complete
    job = _job_id(sweep_dir, 0)
    # submitit's own simulation of a preemption (Job._interrupt): SIGTERM, then USR2
    assert sh(f"scancel --signal=TERM {job} && sleep 1 && scancel --signal=USR2 {job}").returncode == 0
    _wait_for(sweep_dir / "0" / RESUME)
    for _ in range(60):  # Slurm holds a requeued job for a while (BeginTime): let it start now
        if "PENDING" in sh(f"squeue -h -j {job} -o %T").stdout:
            break
        time.sleep(0.5)
    sh(f"scontrol update JobId={job} StartTime=now")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    manifest = json.loads((sweep_dir / "0" / "manifest.json").read_text())
    assert 0 < manifest["resumed_at_step"] < 3000
    assert not (sweep_dir / "0" / RESUME).exists()
    local = subprocess.run([sys.executable, "-m", "runner", *overrides.split(), f"hydra.run.dir={plain}"],
                           cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    for name in ("stats.parquet", "steps.parquet"):
        resumed = pq.read_table(sweep_dir / "0" / name).to_pandas().drop(columns=TIMINGS, errors="ignore")
        whole = pq.read_table(plain / name).to_pandas().drop(columns=TIMINGS, errors="ignore")
        assert len(resumed) == len(whole) > 0
        assert resumed.equals(whole), name


@pytest.mark.parametrize("launcher, line", [
    ("slurm_cpu hydra.launcher.partition=nosuch", "hydra.launcher.partition: sbatch refused the jobs: invalid partition "
     "specified: nosuch (partition='nosuch'; sinfo shows what the cluster has)"),
    ("slurm hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node: sbatch refused the jobs: Invalid generic "
     "resource (gres) specification (gpus_per_node=1, gres=None; sinfo shows what the cluster has)"),
])
def test_sbatchs_refusal_is_one_line_naming_the_launcher_key(slurm, tmp_path, launcher, line):
    proc = submit(f"python -m runner -m hydra/launcher={launcher} model=mlp seed=0,1", tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert [ln for ln in err.splitlines() if "error" in ln] == [f"error: {line}"]


def test_a_sweep_that_fits_no_node_is_cancelled_with_the_reason(slurm, tmp_path):
    proc = submit("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug "
                  "hydra.launcher.cpus_per_task=512 hydra.launcher.unschedulable_after_s=3 model=mlp seed=0,1", tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: hydra.launcher: no job of the sweep could be scheduled: PENDING (")
    assert "cpus_per_task=512" in last and "the jobs were cancelled" in last
    assert sh(f"squeue -h -j {array_id(tmp_path)} -o %T").stdout.strip() in ("", "CANCELLED\nCANCELLED")
