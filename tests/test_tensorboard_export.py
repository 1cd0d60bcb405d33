"""TensorBoard export, read back with TensorBoard's own event reader."""
from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis import tensorboard as tensorboard_export


def read_events(directory):
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    return events


def test_scalars_and_histograms_per_step_read_back(run_with, capsys):
    run_dir = run_with("model=convnet", "steps=2", "hooks=[stats,extract]", "hooks.extract.layers=[conv,relu]",
                       "hooks.extract.kinds=[output,grad_output]")
    tensorboard_export.main([str(run_dir)])
    assert capsys.readouterr().out.strip() == f"wrote {run_dir / 'tensorboard'}"
    events = read_events(run_dir / "tensorboard")
    stats = analysis.load_stats(run_dir)
    tags = events.Tags()
    assert len(tags["scalars"]) == len(stats[stats.step == 0]) * len(tensorboard_export.SCALAR_STATS) + 1
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(s, pytest.approx(v, rel=1e-6)) for s, v in analysis.load_steps(run_dir)[["step", "loss"]].values]
    fc_grad = stats[(stats.hook == "stats") & (stats.layer == "fc") & (stats.kind == "grad_output")]
    assert [e.value for e in events.Scalars("train/stats/fc/grad_output/l2")] == pytest.approx(fc_grad.l2.tolist(), rel=1e-6)

    tensors = analysis.load_tensors(run_dir)
    assert sorted(tags["histograms"]) == ["train/extract/conv/grad_output", "train/extract/conv/output",
                                          "train/extract/relu/grad_output", "train/extract/relu/output"]
    for event in events.Histograms("train/extract/conv/output"):
        t = tensors[(tensors.layer == "conv") & (tensors.kind == "output") & (tensors.step == event.step)].tensor.iloc[0]
        h = event.histogram_value
        assert (h.num, h.min, h.max) == (t.size, pytest.approx(t.min()), pytest.approx(t.max()))
        assert h.sum == pytest.approx(float(t.sum(dtype=np.float64)), rel=1e-5, abs=1e-6)
        assert sum(h.bucket) == t.size
    assert [e.step for e in events.Histograms("train/extract/conv/output")] == [0, 1]


def test_sweep_export_writes_one_directory_per_run_and_replaces_old_events(tmp_path):
    for i in range(2):
        overrides = ["model=linear", "hooks=stats", f"seed={i}"]
        run(make_config(*overrides), tmp_path / str(i), overrides)
    first = tensorboard_export.export(tmp_path)
    again = tensorboard_export.export(tmp_path)
    assert first == again == [tmp_path / "0" / "tensorboard", tmp_path / "1" / "tensorboard"]
    for out in again:
        assert len(list(out.glob("events.out.tfevents.*"))) == 1
        assert "train/stats/(model)/output/mean" in read_events(out).Tags()["scalars"]


def test_train_and_eval_are_written_apart(run_with):
    run_dir = run_with("model=convnet", "data=fake", "loss=cross_entropy", "optimizer=sgd", "steps=4", "eval_every=2",
                       "hooks=stats", "hooks.stats.layers=fc")
    events = read_events(tensorboard_export.export_run(run_dir))
    steps = analysis.load_steps(run_dir)
    for split in ("train", "eval"):
        rows = steps[steps.split == split]
        got = [(e.step, e.value) for e in events.Scalars(f"{split}/loss")]
        assert got == [(s, pytest.approx(v, rel=1e-6)) for s, v in rows[["step", "loss"]].values]
    assert len(steps[steps.split == "eval"]) == 2  # after steps 1 and 3, at the same step numbers as training rows
    stats = analysis.load_stats(run_dir)
    fc = stats[(stats.kind == "output") & (stats.layer == "fc")]
    train, evals = fc[fc.phase == "forward"], fc[fc.phase == "eval"]
    assert [e.value for e in events.Scalars("train/stats/fc/output/mean")] == pytest.approx(train["mean"].tolist())
    assert [(e.step, e.value) for e in events.Scalars("eval/stats/fc/output/mean")] == [
        (s, pytest.approx(v)) for s, v in evals[["step", "mean"]].values]
