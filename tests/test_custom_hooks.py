"""``type: custom``: a function of the user's, registered as each PyTorch hook kind, gives exactly
what the same function registered by hand gives, and is recorded like every other type."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import runner.analysis as analysis
from conftest import hook_count, make_config, run, seeded_batch, stats_of
from hooks import ConfigError, build_hooks
from models_for_tests import KwargsNet
from runner.sources.models import ConvNet
from runner.engine.plan import compile_plan

pytestmark = pytest.mark.statistics

CALLS: list[str] = []


# -- the user's functions, named by import path below -------------------------------------------
def add_one(module, args):
    return args[0] + 1.0


def times_ten(module, args, output):
    return output * 10


def factor_from_kwargs(module, args, kwargs, output):
    return output + kwargs["factor"]


def forty_two(module, grad_input, grad_output):
    return tuple(None if g is None else torch.full_like(g, 42.0) for g in grad_input)


def halve_grad_output(module, grad_output):
    return tuple(g / 2 for g in grad_output)


def double(grad):
    return grad * 2


def zeros(grad):
    return torch.zeros_like(grad)


def count(module, args, output):
    CALLS.append(str(output.device))


def note_param(param):
    CALLS.append(tuple(param.grad.shape))


NOT_CALLABLE = 3


def widen(module, args, output):
    return torch.cat([output, output], dim=-1)


def custom(name: str, **keys) -> str:
    body = ",".join(f"{k}:{v}" for k, v in keys.items())
    return f"+hooks.{name}={{type:custom,{body}}}"


def test_forward_pre_and_forward_replacements_match_pytorch(run_with):
    run_dir = run_with("model=linear", "loss=none",
                       custom("pre", fn="test_custom_hooks.add_one", hook="forward_pre", layers="''"),
                       custom("post", fn="test_custom_hooks.times_ten", hook="forward", layers="''"))
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    x = seeded_batch([2, 3])
    m.register_forward_pre_hook(add_one)
    m.register_forward_hook(times_ten)
    with torch.no_grad():
        expected = m(x)
    pre = stats_of(run_dir, hook="pre").iloc[0]
    assert (pre.kind, pre.slot, pre.phase) == ("input", "0", "forward")
    assert pre["mean"] == pytest.approx((x + 1).mean().item())
    post = stats_of(run_dir, hook="post").iloc[0]
    assert post.kind == "output"
    assert post["mean"] == pytest.approx(expected.mean().item(), rel=1e-6)
    assert post.l2 == pytest.approx(expected.double().norm().item(), rel=1e-6)


def test_forward_hook_with_kwargs_reads_the_call_keywords(run_with):
    run_dir = run_with("model=custom", "model._target_=models_for_tests.KwargsNet", "data.shape=[2,3]",
                       "loss=none", "+hooks.x={type:capture,layers:fc2,kinds:[input]}",
                       custom("kw", fn="test_custom_hooks.factor_from_kwargs", hook="forward", layers="scale",
                              with_kwargs="true"))
    net = KwargsNet.instances[-1]
    x = seeded_batch([2, 3])
    with torch.no_grad():
        expected = net.fc1(x) * 3.0 + 3.0  # the hook adds the call's factor=3.0 to the output
    got = analysis.load_tensors(run_dir).tensor[0]
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)


@pytest.mark.parametrize("hook, fn", [("full_backward", "forty_two"), ("backward_pre", "halve_grad_output")])
def test_module_backward_hooks_return_replacements_as_in_pytorch(run_with, hook, fn):
    run_dir = run_with("model=convnet", "loss=sum", "data.requires_grad=true",
                       custom("b", fn=f"test_custom_hooks.{fn}", hook=hook, layers="fc"),
                       "+hooks.g={type:stats,layers:conv,kinds:[grad_output]}")
    torch.manual_seed(0)
    net = ConvNet()
    getattr(net.fc, f"register_{'full_backward_hook' if hook == 'full_backward' else 'full_backward_pre_hook'}")(
        globals()[fn])
    seen = {}
    net.conv.register_forward_hook(lambda m, a, out: out.register_hook(lambda g: seen.setdefault("conv", g)) and None)
    x = seeded_batch([1, 3, 8, 8]).requires_grad_(True)
    net(x).sum().backward()
    conv = stats_of(run_dir, hook="g", layer="conv").iloc[0]
    assert conv.l2 == pytest.approx(seen["conv"].double().norm().item(), rel=1e-6)
    assert conv["mean"] == pytest.approx(seen["conv"].mean().item(), rel=1e-6, abs=1e-9)
    rows = stats_of(run_dir, hook="b")
    kinds = {"full_backward": {"grad_input", "grad_output"}, "backward_pre": {"grad_output"}}[hook]
    assert set(rows.kind) == kinds and (rows.phase == "backward").all()
    if hook == "full_backward":
        assert (stats_of(run_dir, hook="b", kind="grad_input")["min"] == 42).all()


def test_tensor_hooks_on_outputs_and_params_match_pytorch(run_with):
    run_dir = run_with("model=convnet", "loss=one_minus_mean",
                       custom("d", fn="test_custom_hooks.double", hook="tensor", target="output", layers="relu"),
                       custom("z", fn="test_custom_hooks.zeros", hook="tensor", target="params", layers="fc",
                              params="[bias]"),
                       "+hooks.w={type:post_accumulate,layers:conv,params:[weight]}")
    torch.manual_seed(0)
    net = ConvNet()
    net.relu.register_forward_hook(lambda m, a, out: out.register_hook(double) and None)
    net.fc.bias.register_hook(zeros)
    (1 - net(seeded_batch([1, 3, 8, 8]))).mean().backward()
    conv_w = stats_of(run_dir, hook="w").iloc[0]
    assert conv_w.l2 == pytest.approx(net.conv.weight.grad.double().norm().item(), rel=1e-6)
    doubled = stats_of(run_dir, hook="d").iloc[0]
    assert (doubled.kind, doubled.layer) == ("grad_output", "relu")
    bias = stats_of(run_dir, hook="z").iloc[0]
    assert (bias.kind, bias.slot, bias.zero_frac) == ("param_grad", "bias", 1.0)


def test_post_accumulate_calls_fn_with_the_parameter(run_with):
    CALLS.clear()
    run_with("model=convnet", "loss=sum",
             custom("p", fn="test_custom_hooks.note_param", hook="post_accumulate", layers="fc"))
    assert sorted(CALLS) == [(5,), (5, 160)]


def test_fn_is_rehearsed_once_on_meta_and_max_calls_counts_the_real_calls(run_with):
    CALLS.clear()
    run_dir = run_with("model=mlp", "loss=sum", "steps=3",
                       custom("c", fn="test_custom_hooks.count", hook="forward", layers="fc1", max_calls=2))
    assert CALLS == ["meta", "cpu", "cpu"]  # the rehearsal's call on meta tensors, then exactly two real ones
    assert sorted(stats_of(run_dir, hook="c").step) == [0, 1]


def test_hooks_are_removed_after_the_run(tmp_path):
    from models_for_tests import TrackedResNet18
    
    TrackedResNet18.instances.clear()
    cfg = make_config("model=resnet18", "+model._target_=models_for_tests.TrackedResNet18",
                      "data.shape=[2,3,32,32]", *(custom(f"h{i}", fn=f"test_custom_hooks.{fn}", hook=hook, layers="fc")
                                                  for i, (hook, fn) in enumerate([("forward", "count"),
                                                                                  ("full_backward", "forty_two"),
                                                                                  ("tensor", "double")])))
    run(cfg, tmp_path / "out")
    (model,) = TrackedResNet18.instances
    assert hook_count(model) == 0


@pytest.mark.parametrize("keys, message", [
    ({"fn": "no_such_pkg.f"}, "hooks.h.fn: no module 'no_such_pkg'"),
    ({"fn": "test_custom_hooks.tims_ten"}, "has no 'tims_ten'; did you mean 'test_custom_hooks.times_ten'?"),
    ({"fn": "test_custom_hooks.NOT_CALLABLE"}, "is a int, not a function"),
    ({"fn": "test_custom_hooks.add_one"}, "cannot be called as a forward hook (module, args, output)"),
    ({"fn": "test_custom_hooks.times_ten", "with_kwargs": True}, "(module, args, kwargs, output)"),
    ({"fn": "test_custom_hooks.double", "hook": "tensr"}, "unknown hook kind 'tensr'"),
    ({"fn": "test_custom_hooks.double", "hook": "tensor", "prepend": True}, "hooks.h.prepend: PyTorch has no"),
    ({"fn": "test_custom_hooks.count", "always_call": True, "hook": "forward_pre"}, "hooks.h.always_call"),
    ({"fn": "test_custom_hooks.count", "max_calls": 0}, "hooks.h.max_calls: 0 must be at least 1"),
])
def test_mistakes_are_one_line_naming_the_key(keys, message):
    with pytest.raises(ConfigError) as err:
        build_hooks({"h": {"type": "custom", "layers": "fc", **keys}})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_module_failing_to_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_hooks.py").write_text("import no_such_dependency\ndef f(m, a, o): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^hooks.h.fn: importing 'broken_hooks' failed: No module named"):
        compile_plan(make_config("model=linear", custom("h", fn="broken_hooks.f", layers="''")))


def test_a_forward_hook_that_changes_the_outputs_shape_is_one_line_naming_the_layer(tmp_path):
    import runner

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"hooks.custom: test_custom_hooks.widen changed the output of '0' "
                                          r"from 0: \[3, 4\] to 0: \[3, 8\]") as err:
        with runner.attach(model, hooks=["custom"], out_dir=str(tmp_path / "run"),
                           overrides=["hooks.custom.layers=['0']", "hooks.custom.fn=test_custom_hooks.widen"]) as run:
            model(torch.randn(3, 4))
            run.step()
    assert "\n" not in str(err.value) and hook_count(model) == 0
    assert not (tmp_path / "run" / "manifest.json").exists()
