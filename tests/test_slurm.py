"""Sweeps on a real one-node Slurm cluster (``scripts/slurm-single-node.sh``), run with ``pytest -m slurm``.

The session fixture brings the cluster up (installing Debian's packages when they are missing)
and stops it at the end if it started it; a machine that cannot run Slurm (not root, no apt-get,
a daemon that does not come up) skips these tests with the script's reason. Every command of the
README's "Slurm" part runs here as written (only the sweep directory is the test's own).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
from runner.store.resume import RESUME
from runner.store.sweep_record import SWEEP

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/slurm-single-node.sh"  # as the README writes it, from the repository root
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
#: The README's sweep on the CPU preset (4 jobs).
README_SWEEP = ("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug model=mlp steps=2 "
                "hooks=clip 'hooks.clip={min:-0.1,max:0.1},{min:-0.01,max:0.01}' 'seed=range(0,2)'")
#: Measured, not computed: they differ between any two runs.
TIMINGS = ["wall_time_s", "peak_memory_bytes"]


@pytest.fixture(scope="session")
def slurm():
    """The cluster, up for the session; stopped afterwards when this session started it."""
    if os.geteuid() != 0:
        pytest.skip("cannot run Slurm here: not root (the script runs the daemons as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("cannot run Slurm here: no slurmctld and no apt-get to install it")
    was_up = "slurmctld: running" in _sh(f"{SCRIPT} status").stdout
    proc = _sh(SCRIPT)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    yield
    if not was_up:
        assert _sh(f"{SCRIPT} stop").returncode == 0


def _sh(command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, env=ENV, **kwargs)


def _sweep(command: str, sweep_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(f"{command} hydra.sweep.dir={sweep_dir}", shell=True, cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _array_id(sweep_dir: Path) -> str:
    """The job array's id: submitit's folder ``SWEEP/.submitit/<id>`` (the one without ``_``)."""
    return next(p.name for p in (sweep_dir / ".submitit").iterdir() if "_" not in p.name)


def _job_id(sweep_dir: Path, num: int) -> str:
    """Job ``num``'s Slurm id: ``ARRAY_num``, or the plain id of a one-job sweep (submitted without an array)."""
    array = _array_id(sweep_dir)
    return f"{array}_{num}" if (sweep_dir / ".submitit" / f"{array}_{num}").exists() else array


def _wait_for(path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.5)


def _jobs(sweep_dir: Path) -> dict[int, dict]:
    return {job["num"]: job for job in json.loads((sweep_dir / SWEEP).read_text())["jobs"]}


def _sacct_states(array: str) -> list[str]:
    """The jobs' states by the README's ``sacct`` command (two header lines, then JobID State ExitCode)."""
    lines = _sh(f"sacct -X -j {array} -o JobID,State,ExitCode").stdout.splitlines()[2:]
    return [line.split()[1].rstrip("+") for line in lines]  # CANCELLED+: "CANCELLED by 0", cut to the column


def test_the_readme_sweep_runs_four_jobs_on_slurm_cpu_and_loads_as_one_table(slurm, tmp_path):
    proc = _sweep(README_SWEEP, tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    stats = analysis.load_stats(tmp_path)
    assert stats.run_dir.nunique() == 4
    sizes = stats.groupby(["hooks.clip", "seed"], observed=True).size()  # the symmetric bounds, one text each
    assert len(sizes) == 4 and sizes.nunique() == 1  # every job wrote the same rows
    assert {job["state"] for job in _jobs(tmp_path).values()} == {"ok"}
    assert "slurmd: running" in _sh(f"{SCRIPT} status").stdout
    assert _sacct_states(_array_id(tmp_path)) == ["COMPLETED"] * 4  # the scheduler's states: sacct


def test_a_job_cancelled_with_scancel_is_listed_cancelled(slurm, tmp_path):
    proc = _sweep("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug model=mlp "
                  "steps=2,1000000", tmp_path)
    _wait_for(tmp_path / "1" / ".runner.lock")  # job 1 has started its run
    array = _array_id(tmp_path)
    assert _sh(f"scancel {array}_1").returncode == 0
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert lines[-2:] == ["error: 1 of 2 jobs failed:",
                          f"error: model=mlp steps=1000000: cancelled (job {array}_1): Slurm state CANCELLED by 0"]
    assert json.loads((tmp_path / "1" / "status.json").read_text())["status"] == "cancelled"
    jobs = _jobs(tmp_path)
    assert (jobs[0]["state"], jobs[1]["state"]) == ("ok", "cancelled")
    assert analysis.failed_jobs(tmp_path).overrides.tolist() == ["model=mlp steps=1000000"]
    assert analysis.load_steps(tmp_path).run_dir.nunique() == 1
    assert sorted(_sacct_states(array)) == ["CANCELLED", "COMPLETED"]


def test_a_preempted_job_is_requeued_and_ends_with_an_uninterrupted_runs_tables(slurm, tmp_path):
    overrides = "model=mlp optimizer=adam hooks=stats steps=3000"  # long enough to be running when preempted
    sweep_dir, plain = tmp_path / "sweep", tmp_path / "plain"
    proc = _sweep(f"python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug {overrides}",
                  sweep_dir)
    _wait_for(sweep_dir / "0" / ".runner.lock")
    time.sleep(5)  # some steps complete
    job = _job_id(sweep_dir, 0)
    # submitit's own simulation of a preemption (Job._interrupt): SIGTERM, then USR2
    assert _sh(f"scancel --signal=TERM {job} && sleep 1 && scancel --signal=USR2 {job}").returncode == 0
    _wait_for(sweep_dir / "0" / RESUME)
    for _ in range(60):  # Slurm holds a requeued job for a while (BeginTime): let it start now
        if "PENDING" in _sh(f"squeue -h -j {job} -o %T").stdout:
            break
        time.sleep(0.5)
    _sh(f"scontrol update JobId={job} StartTime=now")
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
    proc = _sweep(f"python -m runner -m hydra/launcher={launcher} model=mlp seed=0,1", tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert [ln for ln in err.splitlines() if "error" in ln] == [f"error: {line}"]


def test_a_sweep_that_fits_no_node_is_cancelled_with_the_reason(slurm, tmp_path):
    proc = _sweep("python -m runner -m hydra/launcher=slurm_cpu hydra.launcher.partition=debug "
                  "hydra.launcher.cpus_per_task=512 hydra.launcher.unschedulable_after_s=3 model=mlp seed=0,1", tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: hydra.launcher: no job of the sweep could be scheduled: PENDING (")
    assert "cpus_per_task=512" in last and "the jobs were cancelled" in last
    assert _sh(f"squeue -h -j {_array_id(tmp_path)} -o %T").stdout.strip() in ("", "CANCELLED\nCANCELLED")
