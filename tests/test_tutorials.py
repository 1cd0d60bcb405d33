"""Each classic tutorial example, as one runner config, against the same hook written by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import runner.analysis as analysis
from conftest import seeded_batch, stats_of
from runner.sources.models import ConvNet

pytestmark = pytest.mark.statistics

RESNET50_CHILDREN = [
    ("conv1", [2, 64, 112, 112]), ("bn1", [2, 64, 112, 112]), ("relu", [2, 64, 112, 112]),
    ("maxpool", [2, 64, 56, 56]), ("layer1", [2, 256, 56, 56]), ("layer2", [2, 512, 28, 28]),
    ("layer3", [2, 1024, 14, 14]), ("layer4", [2, 2048, 7, 7]), ("avgpool", [2, 2048, 1, 1]),
    ("fc", [2, 1000]),
]


def test_print_and_extract_resnet50_match_hand_written_hooks(run_with, capsys):
    run_dir = run_with("model=resnet50", "data=ones", "data.shape=[2,3,224,224]", "loss=none", "hooks=[print,extract]")
    printed = [line for line in capsys.readouterr().out.splitlines() if ": torch.Size" in line]
    assert printed == [f"{n}: torch.Size({s})" for n, s in RESNET50_CHILDREN]

    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    features = {}
    for name in ("layer4", "avgpool"):
        getattr(model, name).register_forward_hook(
            lambda _m, _i, out, name=name: features.__setitem__(name, out.detach().clone()))
    with torch.no_grad():
        model(torch.ones(2, 3, 224, 224))

    tensors = analysis.load_tensors(run_dir).set_index("layer")
    assert sorted(tensors.index) == ["avgpool", "layer4"]
    for name, expected in features.items():
        got = tensors.loc[name, "tensor"]
        assert got.shape == tuple(expected.shape) == {"layer4": (2, 2048, 7, 7), "avgpool": (2, 2048, 1, 1)}[name]
        np.testing.assert_array_equal(got, expected.numpy())


def _hand_clipped_resnet18(shape):
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    for p in model.parameters():
        p.register_hook(lambda grad: grad.clamp_(-0.01, 0.01))
    model(torch.ones(shape)).log().mean().backward()
    return model


def test_clip_resnet18_gradients_match_hand_written_clipper(run_with):
    shape = [2, 3, 64, 64]
    run_dir = run_with("model=resnet18", "data=ones", f"data.shape={shape}".replace(" ", ""),
                       "loss=log_mean", "hooks=clip")
    model = _hand_clipped_resnet18(shape)
    final = stats_of(run_dir, phase="after_backward", kind="param_grad")
    modules = dict(model.named_modules())
    assert len(final) == len(list(model.parameters()))
    for row in final.itertuples():
        grad = getattr(modules[row.layer], row.slot).grad
        assert row.max <= 0.01 and row.min >= -0.01
        assert row.max == pytest.approx(grad.max().item()) and row.min == pytest.approx(grad.min().item())
        exact = grad.double()  # float32 torch.norm is itself off by ~1e-5 on large tensors
        assert row.l2 == pytest.approx(exact.norm().item(), rel=1e-6)
        # float32 sums: the error scales with the magnitudes summed, not with their (cancelling) total
        assert row.mean == pytest.approx(exact.mean().item(), abs=1e-6 * exact.abs().mean().item())
    # The hook really clipped something: without it the fc bias gradient leaves [-0.01, 0.01].
    torch.manual_seed(0)
    bare = torchvision.models.resnet18()
    bare(torch.ones(shape)).log().mean().backward()
    assert bare.fc.bias.grad.abs().max() > 0.01


def test_zero_bias_convnet_matches_tutorial(run_with):
    torch.manual_seed(0)
    net = ConvNet()
    (1 - net(seeded_batch([1, 3, 8, 8]))).mean().backward()
    torch.testing.assert_close(net.fc.bias.grad, torch.full((5,), -0.2))  # the tutorial's numbers

    run_dir = run_with("model=convnet", "loss=one_minus_mean", "hooks=zero_bias")
    rows = stats_of(run_dir, hook="zero_bias", slot="bias")
    assert set(rows.phase) == {"backward", "after_backward"}
    assert (rows.layer == "fc").all() and (rows.zero_frac == 1.0).all() and (rows.l2 == 0).all()


def test_shift_linear_input_matches_hand_written_pre_hook(run_with):
    run_dir = run_with("model=linear", "hooks=[shift,extract]", "hooks.extract.layers=''", "loss=none")
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    x = seeded_batch([2, 3])
    m.register_forward_pre_hook(lambda _m, inputs: inputs[0] + 1.0)
    with torch.no_grad():
        expected = m(x)
    got = analysis.load_tensors(run_dir).tensor[0]
    np.testing.assert_array_equal(got, expected.numpy())
    shifted = stats_of(run_dir, hook="shift", kind="input").iloc[0]
    assert shifted["mean"] == pytest.approx((x + 1).mean().item())


def test_clamp_relu_output_gradient_matches_tutorial(run_with):
    """The tutorial's ``x.register_hook(lambda g: torch.clamp(g, min=0))`` on the ReLU output."""
    run_dir = run_with("model=convnet", "loss=one_minus_mean", "hooks=[clip,stats]",
                       "hooks.clip.target=output", "hooks.clip.layers=relu",
                       "hooks.clip.min=0", "hooks.clip.max=null")
    torch.manual_seed(0)
    net = ConvNet()
    grads = {}

    def clamp_relu_grad(_m, _i, out):  # a lambda would return the handle and replace the output
        out.register_hook(lambda g: torch.clamp(g, min=0))

    def keep_conv_grad(_m, _i, out):
        out.register_hook(lambda g: grads.__setitem__("conv", g.clone()))

    net.relu.register_forward_hook(clamp_relu_grad)
    net.conv.register_forward_hook(keep_conv_grad)
    (1 - net(seeded_batch([1, 3, 8, 8]))).mean().backward()

    clamped = stats_of(run_dir, hook="clip", kind="grad_output").iloc[0]
    assert clamped.layer == "relu" and clamped["min"] >= 0
    conv = stats_of(run_dir, hook="stats", layer="conv", kind="grad_output").iloc[0]
    assert conv["min"] >= 0
    assert conv.l2 == pytest.approx(grads["conv"].norm().item(), rel=1e-6)
    assert conv["mean"] == pytest.approx(grads["conv"].mean().item(), rel=1e-6)
