"""Multirun through Hydra's launchers: joblib (local processes) and submitit (its local mode, for real).

Each sweep runs the real CLI in a subprocess on a tiny model and is read back as one DataFrame.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class

import runner.analysis as analysis
from runner.config.compose import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]
TINY = ("model=convnet", "data.shape=[2,3,8,8]", "hooks=clip")
pytestmark = pytest.mark.slow


def multirun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", "-m", *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def job_dirs(sweep_dir: Path) -> list[str]:
    return sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_joblib_sweep_of_a_list_and_a_range_gives_one_table(tmp_path):
    proc = multirun("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hooks.clip.max=0.1,0.001",
                    "seed=range(0,2)", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "Joblib.Parallel" in proc.stderr + proc.stdout  # the joblib launcher ran the jobs
    assert job_dirs(tmp_path) == ["0", "1", "2", "3"]
    df = analysis.load_stats(tmp_path)
    assert df.groupby(["hooks.clip.max", "seed"]).run_dir.nunique().to_dict() == {
        (0.001, 0): 1, (0.001, 1): 1, (0.1, 0): 1, (0.1, 1): 1}
    final = df[df.phase == "after_backward"]
    for bound, rows in final.groupby("hooks.clip.max"):
        assert rows["max"].max() <= np.float32(bound)  # the clamp ran in float32
    # Different seeds give different models: the same parameter's gradient differs between them.
    per_seed = final[final["hooks.clip.max"] == 0.1].groupby("seed").l2.sum()
    assert per_seed[0] != per_seed[1]


def test_submitit_local_sweep_runs_each_job_in_its_own_directory(tmp_path):
    proc = multirun("hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "optimizer=none,sgd",
                    "steps=2", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert job_dirs(tmp_path) == ["0", "1"]
    assert (tmp_path / ".submitit").is_dir()  # submitit's own job folders and logs
    steps = analysis.load_steps(tmp_path)
    assert steps.groupby("optimizer").size().to_dict() == {"none": 2, "sgd": 2}
    trained = steps[steps.optimizer == "sgd"].loss.to_numpy()
    measured = steps[steps.optimizer == "none"].loss.to_numpy()
    assert trained[0] == measured[0] and trained[1] != measured[1]  # same start; sgd moved the weights
    assert len(analysis.load_stats(tmp_path).run_dir.unique()) == 2


def test_slurm_preset_is_the_submitit_slurm_launcher_with_cluster_settings():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    bases = [f"{c.__module__}.{c.__name__}" for c in get_class(launcher._target_).__mro__]  # Hydra reloads plugins
    assert "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in bases
    assert (launcher.partition, launcher.timeout_min, launcher.gpus_per_node, launcher.tasks_per_node) == (
        "gpu", 120, 1, 1)
    assert launcher.submitit_folder == f"{cfg.hydra.sweep.dir}/.submitit/%j"  # inside the sweep directory
