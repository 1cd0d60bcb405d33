"""Training runs: optimizers, fake data, eval passes, the progress bar and ``compile=true``.

Every loss curve is checked against the same training loop written in plain PyTorch.
"""
from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torchvision import datasets, transforms

from common.errors import ConfigError
import runner.analysis as analysis
from conftest import make_config, run, stats_of
from runner.sources.models import ConvNet
from runner.engine.progress import progress_bar

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("model=convnet", "data=fake", "data.shape=[4,3,8,8]", "loss=cross_entropy", "steps=4")


def fake_batches(seed: int, n: int, size: int = 1000, shape=(4, 3, 8, 8), classes: int = 5):
    """The first ``n`` batches of torchvision's FakeData as ``data=fake`` reads them."""
    ds = datasets.FakeData(size=size, image_size=shape[1:], num_classes=classes,
                           transform=transforms.ToTensor(), random_offset=seed * size)
    items = [ds[i] for i in range(n * shape[0])]
    return [(torch.stack([x for x, _ in items[k:k + shape[0]]]), torch.tensor([y for _, y in items[k:k + shape[0]]]))
            for k in range(0, len(items), shape[0])]


def plain_training(optimizer: str, lr: float, clip: float | None, steps: int = 4) -> list[float]:
    """The loss curve of the same run written by hand: tensor hooks clamping each parameter's gradient."""
    torch.manual_seed(0)
    model = ConvNet()
    handles = [p.register_hook(lambda g: g.clamp(-clip, clip)) for p in model.parameters()] if clip else []
    opt = torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd" else torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for x, y in fake_batches(0, steps):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for h in handles:
        h.remove()
    return losses


# Adam's first update is lr * sign(grad) (its moments cancel the scale), which clamping keeps:
# the curves part from step 2 on, SGD's from step 1.
@pytest.mark.parametrize("optimizer,lr,parts", [("sgd", 0.5, 1), ("adam", 0.05, 2)])
def test_clip_changes_the_loss_curve_as_plain_pytorch_does(run_with, optimizer, lr, parts):
    common = (*TRAIN, f"optimizer={optimizer}", f"optimizer.lr={lr}")
    free = analysis.load_steps(run_with(*common))
    clipped_dir = run_with(*common, "hooks=clip")
    clipped = analysis.load_steps(clipped_dir)
    np.testing.assert_allclose(free.loss, plain_training(optimizer, lr, None), rtol=1e-5)
    np.testing.assert_allclose(clipped.loss, plain_training(optimizer, lr, 0.01), rtol=1e-5)
    assert free.loss[0] == clipped.loss[0]  # same weights, same batch
    assert (np.abs(free.loss[parts:].to_numpy() - clipped.loss[parts:].to_numpy()) > 1e-3).all()
    grads = stats_of(clipped_dir, kind="param_grad")
    assert set(grads.step) == {0, 1, 2, 3}
    assert grads["max"].max() <= 0.01 and grads["min"].min() >= -0.01


def test_without_optimizer_steps_measure_the_same_weights_quietly(run_with, capsys):
    steps = analysis.load_steps(run_with("model=convnet", "data=ones", "steps=12", "hooks=clip"))
    assert steps.loss.nunique() == 1
    assert list(steps.split) == ["train"] * 12
    assert capsys.readouterr().out == ""  # stdout is not a terminal here: no progress bar


def test_fake_data_is_torchvision_fakedata_with_its_labels(run_with):
    run_dir = run_with("model=convnet", "data=fake", "data.shape=[4,3,8,8]", "steps=2", "loss=cross_entropy",
                       "hooks=extract", "hooks.extract.layers=''", "hooks.extract.kinds=[input]", "seed=3")
    tensors = analysis.load_tensors(run_dir).sort_values("step")
    expected = fake_batches(3, 2)
    for got, (x, _) in zip(tensors.tensor, expected):
        np.testing.assert_array_equal(got, x.numpy())
    torch.manual_seed(3)
    model = ConvNet()
    losses = [F.cross_entropy(model(x), y).item() for x, y in expected]
    np.testing.assert_allclose(analysis.load_steps(run_dir).loss, losses, rtol=1e-6)


def test_eval_passes_run_without_gradients_on_a_fixed_held_out_set(run_with):
    run_dir = run_with("model=convnet", "data.shape=[2,3,8,8]", "loss=mean", "steps=4", "eval_every=2",
                       "eval_steps=2", "hooks=stats")
    steps = analysis.load_steps(run_dir)
    assert list(zip(steps.step, steps.split)) == [(0, "train"), (1, "train"), (1, "eval"), (2, "train"),
                                                  (3, "train"), (3, "eval")]
    torch.manual_seed(0)
    model = ConvNet().eval()
    gen = torch.Generator().manual_seed(1 << 20)  # data=randn: a batch, then its random targets, per step
    held_out = [(torch.randn((2, 3, 8, 8), generator=gen), torch.randint(0, 5, (2,), generator=gen))[0]
                for _ in range(2)]
    with torch.no_grad():
        expected = np.mean([model(x).mean().item() for x in held_out])
    np.testing.assert_allclose(steps[steps.split == "eval"].loss, [expected, expected], rtol=1e-6)
    evals = stats_of(run_dir, phase="eval")
    assert set(evals.kind) == {"output"}  # no gradient in eval passes
    assert sorted(evals[(evals.step == 1) & (evals.layer == "fc")].call) == [0, 1]  # one call per batch
    fc_first = evals[(evals.step == 1) & (evals.layer == "fc") & (evals.call == 0)]
    with torch.no_grad():
        np.testing.assert_allclose(fc_first["mean"], [model(held_out[0]).mean().item()], rtol=1e-5)


@pytest.mark.parametrize("overrides,message", [
    (("optimizer=sgd", "optimizer.lr=-1"), "optimizer.lr: -1.0 must be >= 0"),
    (("optimizer=sgd", "optimizer.name=sgdd"), "optimizer.name: unknown optimizer 'sgdd'; valid: adam, none, sgd; "
                                               "did you mean 'sgd'?"),
    (("optimizer=sgd", "+optimizer.momentun=0.9"), "did you mean 'momentum'?"),
    (("optimizer=adam", "optimizer.betas=[0.9,1.5]"), "optimizer.betas: [0.9, 1.5] must be two numbers in [0, 1)"),
    (("optimizer=sgd", "loss=none"), "optimizer: 'sgd' needs a loss to train on but loss=none"),
    (("eval_every=-1",), "eval_every: -1 must be at least 0"),
    (("compile=maybe",), "compile: 'maybe' must be true or false"),
    (("eval_every=1", "eval_steps=0"), "eval_steps: 0 must be at least 1"),
    (("data=fake", "data.shape=[2,100]"), "data.shape: [2, 100]: fake images need [N, C, H, W]"),
    (("compile=true", "hooks=stats"), "hooks.stats: hook type 'stats' hooks activation gradients (grad_output) "
                                      "through tensor hooks, which torch.compile does not support"),
    (("compile=true", "hooks=clip", "hooks.clip.target=output"), "hooks.clip: hook type 'clamp' changes activation "
                                                                 "gradients through tensor hooks (target=output)"),
])
def test_training_config_errors_fail_before_anything_is_written(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        run(make_config("model=convnet", *overrides), tmp_path / "run", overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_progress_bar_shows_only_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, enabled, total, shown in [(Terminal(), True, 20, True), (io.StringIO(), True, 20, False),
                                          (Terminal(), False, 20, False), (Terminal(), True, 3, False)]:
        with progress_bar(total, enabled, stream) as bar:
            bar.update(total)
        assert (f"{total}/{total}" in stream.getvalue()) is shown, (enabled, total)


@pytest.mark.slow
def test_cli_draws_a_progress_bar_on_a_terminal(tmp_path):
    args = [sys.executable, "-m", "runner", "model=convnet", "steps=12", "hooks=none"]
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a pty starts 0 columns wide
    proc = subprocess.Popen([*args, f"hydra.run.dir={tmp_path / 'tty'}"], cwd=ROOT, stdout=follower,
                            stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    os.close(leader)
    assert b"12/12" in out


@pytest.mark.compiled
def test_compiled_model_records_what_eager_records(run_with):
    common = ("model=convnet", "data.shape=[2,3,8,8]", "steps=3", "optimizer=sgd", "optimizer.lr=0.1",
              "hooks=[clip,shift,stats]", "hooks.shift.layers=fc", "hooks.stats.kinds=[output,input]")
    key = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
    eager_dir = run_with(*common)
    eager = analysis.load_stats(eager_dir).sort_values(key).reset_index(drop=True)
    compiled_dir = run_with(*common, "compile=true")
    compiled = analysis.load_stats(compiled_dir).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(compiled[key], eager[key])
    for column in ("mean", "std", "min", "max", "l2"):
        np.testing.assert_allclose(compiled[column], eager[column], rtol=1e-4, atol=1e-7, err_msg=column)
    np.testing.assert_allclose(analysis.load_steps(compiled_dir).loss, analysis.load_steps(eager_dir).loss,
                               rtol=1e-5)
