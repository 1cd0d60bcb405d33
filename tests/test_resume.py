"""A job the scheduler requeues (submitit's USR2 handler exits with ``SystemExit`` mid-step) goes on
from its last complete step, and its files equal an uninterrupted run's."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from conftest import make_config, run
from runner.engine import loop
from common.resume_point import RESUME, read_resume_point

OVERRIDES = ("model=convnet", "data=fake", "data.shape=[4,3,8,8]", "loss=cross_entropy", "optimizer=adam",
             "steps=6", "eval_every=2", "hooks=stats")
#: Measured, not computed: they differ between any two runs.
TIMINGS = ["wall_time_s", "peak_memory_bytes"]


def tables(run_dir):
    return {name: pq.read_table(run_dir / name).to_pandas().drop(columns=TIMINGS, errors="ignore")
            for name in ("stats.parquet", "steps.parquet")}


def requeued_in_step(n: int, monkeypatch):
    """``train_step`` that exits as submitit does after requeueing the job, inside training step ``n``."""
    real, calls = loop.train_step, []

    def step(*args):
        calls.append(1)
        if len(calls) == n + 1:
            raise SystemExit(-1)
        return real(*args)

    monkeypatch.setattr(loop, "train_step", step)
    return real


#: Lifetimes that straddle the requeue: ``stats`` ends by ``max_calls`` during step 2, ``clip``
#: starts at step 3 and the custom hook stops after 10 calls; the requeue comes in step 4.
LIFETIMES = ("hooks=[stats,clip,custom]", "hooks.stats.max_calls=20", "hooks.clip.steps=[3,6]",
             "hooks.custom.layers=fc", "hooks.custom.fn=test_custom_hooks.times_ten",
             "hooks.custom.max_calls=10")


@pytest.mark.parametrize("overrides", [OVERRIDES, OVERRIDES[:-1] + LIFETIMES], ids=["stats", "lifetimes"])
def test_a_requeued_run_resumes_at_its_last_complete_step_and_equals_an_uninterrupted_run(tmp_path, monkeypatch,
                                                                                          overrides):
    whole = run(make_config(*overrides), tmp_path / "whole", overrides)
    lifetimes = json.loads((whole / "manifest.json").read_text())["lifetimes"]
    if "lifetimes" in str(tmp_path):
        assert lifetimes["hooks.stats"]["removed_at_step"] < 4 and lifetimes["hooks.clip"]["attached_at_step"] == 3
        assert lifetimes["hooks.custom"]["calls"] == 10
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real = requeued_in_step(4, monkeypatch)
    out = tmp_path / "requeued"
    with pytest.raises(SystemExit):
        run(make_config(*overrides), out, overrides)
    assert not (out / "manifest.json").exists()
    kept = read_resume_point(out)[1]["steps.parquet"].to_pandas()  # the one reader of the format
    assert sorted(kept.step.unique()) == [0, 1, 2, 3]  # steps 0-3 complete, with the eval rows after 1 and 3
    monkeypatch.setattr(loop, "train_step", real)
    run(make_config(*overrides), out, overrides)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_at_step"] == 4 and manifest["lifetimes"] == lifetimes
    assert not (out / RESUME).exists()
    for name, table in tables(whole).items():
        resumed = tables(out)[name]
        assert len(resumed) == len(table) > 0
        assert resumed.equals(table), name  # the same rows, losses and statistics: the state went on exactly


def test_outside_a_scheduler_job_an_interrupted_run_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    requeued_in_step(2, monkeypatch)
    with pytest.raises(SystemExit):
        run(make_config(*OVERRIDES), tmp_path / "run", OVERRIDES)
    assert not (tmp_path / "run" / RESUME).exists()
    assert not any(p.suffix == ".parquet" for p in (tmp_path / "run").rglob("*"))


def test_a_resume_point_of_another_config_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real = requeued_in_step(3, monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        run(make_config(*OVERRIDES), out, OVERRIDES)
    monkeypatch.setattr(loop, "train_step", real)
    other = OVERRIDES[:-1] + ("hooks=clip",)
    run(make_config(*other), out, other)
    manifest = json.loads((out / "manifest.json").read_text())
    assert "resumed_at_step" not in manifest and not (out / RESUME).exists()
    assert sorted(pq.read_table(out / "steps.parquet").to_pandas().step.unique()) == list(range(6))
