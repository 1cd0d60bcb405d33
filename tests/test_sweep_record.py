"""``sweep.json``: every job of a sweep with its run state, written at the sweep's end and read by the loaders."""
from __future__ import annotations

import json

import pytest

import runner.analysis as analysis
from conftest import run_main
from runner.analysis.sweep_jobs import IncompleteSweepWarning
from common.sweep_format import SWEEP


def test_a_sweep_with_a_failed_job_lists_every_job_in_sweep_json(tmp_path, monkeypatch, capsys):
    proc = run_main(monkeypatch, capsys, "-m", "model=convnet", "hooks=clip", "steps=1", "loss=sum,log_mean",
                    "on_nonfinite=error", f"hydra.sweep.dir={tmp_path}")
    assert proc.code == 1
    record = json.loads((tmp_path / SWEEP).read_text())
    assert record["states"] == {"ok": 1, "failed": 1}
    ok, failed = record["jobs"]
    assert (ok["num"], ok["state"], ok["error"], ok["run_dir"]) == (0, "ok", None, "0")
    assert ok["overrides"] == ["model=convnet", "hooks=clip", "steps=1", "loss=sum", "on_nonfinite=error"]
    assert (failed["state"], failed["run_dir"]) == ("failed", "1") and "the loss is nan" in failed["error"]
    assert f"job 1 ({' '.join(failed['overrides'])}): failed: {failed['error']}; its status: " in proc.stderr  # the closing list
    with pytest.warns(IncompleteSweepWarning, match=r"2 jobs: 1 complete, 1 failed \(job 1: loss=log_mean\)"):
        assert analysis.load_steps(tmp_path).loss.notna().all()  # only the complete job's rows
    assert analysis.failed_jobs(tmp_path).to_dict("records") == [
        {"job_dir": str(tmp_path / "1"), "overrides": " ".join(failed["overrides"]), "error": failed["error"]}]


def test_the_loaders_read_the_runs_sweep_json_lists(tmp_path, monkeypatch, capsys):
    proc = run_main(monkeypatch, capsys, "-m", "model=linear", "steps=1", "seed=0,1", f"hydra.sweep.dir={tmp_path}")
    assert proc.code == 0, proc.stderr
    assert analysis.load_steps(tmp_path).run_dir.nunique() == 2
    record = json.loads((tmp_path / SWEEP).read_text())
    record["jobs"] = record["jobs"][:1]  # a sweep.json that lists job 0 only: job 1 is not read
    (tmp_path / SWEEP).write_text(json.dumps(record))
    assert analysis.load_steps(tmp_path).run_dir.unique().tolist() == [str(tmp_path / "0")]
