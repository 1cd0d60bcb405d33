"""The real command line, in a subprocess: one run, a four-job sweep, and a user error."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import runner.analysis as analysis
from hooks import HOOK_TYPES

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_sweep_of_hooks_and_models_gives_one_table(tmp_path):
    proc = cli("-m", "hooks=clip,zero_bias", "model=resnet18,convnet", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    df = analysis.load_stats(tmp_path)
    jobs = df.groupby(["hooks", "model"]).run_dir.nunique()
    assert jobs.to_dict() == {("clip", "convnet"): 1, ("clip", "resnet18"): 1,
                              ("zero_bias", "convnet"): 1, ("zero_bias", "resnet18"): 1}
    final = df[df.phase == "after_backward"]
    assert (final[final.hooks == "clip"]["max"] <= 0.01 * (1 + 1e-7)).all()
    assert (final[final.hooks == "zero_bias"].l2 == 0).all()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    assert not list((tmp_path / "0").glob("*.log"))  # Hydra logs to the terminal: no empty log file per run


def test_user_error_is_one_line_with_exit_code_2_and_no_output(tmp_path):
    proc = cli("model=convnet", "hooks=clip", "hooks.clip.type=clmap", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: hooks.clip.type: unknown hook type 'clmap'; valid: {', '.join(sorted(HOOK_TYPES))}; "
        "did you mean 'clamp'?"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir())  # rejected before Hydra created .hydra/ or the log
