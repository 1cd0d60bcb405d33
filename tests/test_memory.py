"""Memory bounds: captures stream to parquet in row groups, and sampling narrows big captures.

The peak-memory test runs the runner in subprocesses that sample their own resident memory
(``/proc/self/statm``) while ``run`` works: tensor and Arrow buffers live outside Python's
allocator, so ``tracemalloc`` would not see them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from common.errors import ConfigError
import runner.analysis as analysis
from conftest import make_config, run, seeded_batch
from hooks.mechanism.recorder import sampled_channels
from runner.sources.models import MLP, ConvNet

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
# 2 x [512, 200] float32 outputs kept per step: 0.8 MiB a step, 160 MiB over 200 steps.
CAPTURE = ("model=mlp", "data.shape=[512,100]", "loss=none", "hooks=extract", "hooks.extract.layers=[fc1,relu]")
PER_STEP = 2 * 512 * 200 * 4

PEAK_SCRIPT = """
import json, os, sys, threading, time
from runner.config.compose import compose_config
from runner.engine.loop import run
from runner.engine.plan import compile_plan

out_dir, *overrides = sys.argv[1:]
plan = compile_plan(compose_config(overrides))
page = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.005)

base = rss()
sampler = threading.Thread(target=sample)
sampler.start()
try:
    run(plan, out_dir)
finally:
    done.set()
    sampler.join()
print(json.dumps({"growth": max(peak[0], rss()) - base}))
"""


def peak_growths(runs: dict[Path, tuple[str, ...]]) -> list[int]:
    """For each run (its own process, all at once), the resident memory it added at its peak."""
    procs = [subprocess.Popen([sys.executable, "-c", PEAK_SCRIPT, str(out_dir), *overrides], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for out_dir, overrides in runs.items()]
    growths = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        growths.append(json.loads(out.strip().splitlines()[-1])["growth"])
    return growths


@pytest.mark.slow
def test_peak_memory_of_a_capture_does_not_grow_with_the_number_of_steps(tmp_path):
    short, long, unbounded = peak_growths({
        tmp_path / "short": (*CAPTURE, "steps=20", "output.row_group_mb=4"),
        tmp_path / "long": (*CAPTURE, "steps=200", "output.row_group_mb=4"),
        # The control: a budget larger than the capture keeps everything in memory until the end.
        tmp_path / "unbounded": (*CAPTURE, "steps=200", "output.row_group_mb=1024"),
    })
    captured = 200 * PER_STEP
    print(f"peak growth: 20 steps {short / MiB:.1f} MiB, 200 steps {long / MiB:.1f} MiB, "
          f"200 steps unbounded {unbounded / MiB:.1f} MiB; captured {captured / MiB:.0f} MiB")
    # A row group holds at most the budget plus one step.
    assert pq.read_metadata(tmp_path / "long" / "tensors.parquet").num_row_groups >= captured // (4 * MiB + PER_STEP)
    assert unbounded - long > captured // 2  # the measurement sees buffering when there is some
    assert long - short < 16 * MiB


@pytest.mark.parametrize("value, problem", [("0", "must be a positive number of MiB"),
                                            ("-1", "must be a positive number of MiB"), ("abc", "is not a number")])
def test_row_group_budget_must_be_a_positive_size(tmp_path, value, problem):
    with pytest.raises(ConfigError, match=rf"^output.row_group_mb: .*{value}.* {problem}$"):
        run(make_config("model=convnet", f"output.row_group_mb={value}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_row_groups_are_written_as_the_budget_fills(run_with):
    run_dir = run_with("model=mlp", "data.shape=[64,100]", "loss=none", "hooks=extract",
                       "hooks.extract.layers=fc1", "steps=10", "output.row_group_mb=0.09")
    meta = pq.read_metadata(run_dir / "tensors.parquet")
    assert meta.num_rows == 10 and meta.num_row_groups == 5  # 50 KiB a step: two steps fill 92 KiB


def test_sample_every_records_every_kth_step_and_still_runs_the_others(run_with):
    run_dir = run_with("model=convnet", "hooks=[clip,stats]", "steps=7", "sample.every=3", "optimizer=sgd")
    steps = analysis.load_steps(run_dir)
    assert list(steps.step) == list(range(7))
    assert [s for s, n in zip(steps.step, steps.captures) if n] == [0, 3, 6]
    assert sorted(analysis.load_stats(run_dir).step.unique()) == [0, 3, 6]


def test_sample_batch_keeps_the_first_samples_of_activations_only(run_with):
    run_dir = run_with("model=mlp", "data.shape=[5,100]", "hooks=[extract,clip]", "hooks.extract.layers=fc1",
                       "sample.batch=2")
    tensors = analysis.load_tensors(run_dir)
    torch.manual_seed(0)
    expected = MLP().fc1(seeded_batch([5, 100]))[:2].detach().numpy()
    (got,) = tensors.tensor
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    stats = analysis.load_stats(run_dir)
    assert stats[stats.kind == "output"]["tensor_shape"].map(list).tolist() == [[2, 200]]
    weight_grads = stats[(stats.slot == "weight") & (stats.kind == "param_grad")]["tensor_shape"].map(list).tolist()
    assert sorted(weight_grads) == [[5, 200], [5, 200], [200, 100], [200, 100]]  # whole: no batch dimension


def test_sample_channels_keeps_the_same_random_channels_every_step(run_with):
    run_dir = run_with("model=convnet", "data.shape=[2,3,8,8]", "hooks=extract", "hooks.extract.layers=conv",
                       "hooks.extract.kinds=[input,output]", "sample.channels=4", "steps=2", "seed=5")
    tensors = analysis.load_tensors(run_dir).sort_values(["step", "kind"])
    index = sampled_channels(10, 4, 5)
    assert len(index.unique()) == 4
    torch.manual_seed(5)
    conv = ConvNet().conv
    gen = torch.Generator().manual_seed(5)
    for step in (0, 1):
        x = torch.randn((2, 3, 8, 8), generator=gen)
        torch.randint(0, 5, (2,), generator=gen)  # the step's targets, drawn after its batch
        got = tensors[tensors.step == step].set_index("kind").tensor
        np.testing.assert_array_equal(got["input"], x.numpy())  # 3 channels: fewer than 4, all kept
        np.testing.assert_allclose(got["output"], conv(x)[:, index].detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("overrides,message", [
    (("sample.every=0",), "sample.every: 0 must be at least 1 (1 = every step)"),
    (("sample.batch=0",), "sample.batch: 0 must be at least 1, or null for all of them"),
    (("sample.channels=-2",), "sample.channels: -2 must be at least 1, or null for all of them"),
    (("+sample.chanels=4",), "sample.chanels: unknown key for sample 'chanels'; valid: batch, channels, every; "
                             "did you mean 'channels'?"),
])
def test_sampling_keys_are_validated(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        run(make_config("model=convnet", *overrides), tmp_path / "run")


def test_gradient_hooks_let_go_of_a_tapped_output_once_backward_begins():
    """The runner's gradient hooks keep no output alive in backward: autograd frees ``y`` (nothing
    saved it) while backward is still running, as it would without hooks."""
    import weakref

    from hooks import HookSession, build_hooks

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    alive = []
    with HookSession(model, build_hooks({"s": {"type": "stats", "layers": "0"}})) as session:
        y = model(x)
        ref = weakref.ref(y)
        loss = (y * 2).sum()  # a product with a constant saves neither factor
        del y
        x.register_hook(lambda g: alive.append(ref() is not None))  # after layer 0's backward
        loss.backward()
        session.after_backward()
    assert alive == [False]
