"""Each hook kind of issue 3 against the same hook written by hand in plain PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

from common.errors import ConfigError
import runner.analysis as analysis
from conftest import hook_count, make_config, run, seeded_batch, stats_of
from models_for_tests import KwargsNet, MakesModules, TrackedResNet18
from runner.sources.models import ConvNet

pytestmark = pytest.mark.statistics

CONVNET_LEAVES = ["conv", "relu", "flatten", "fc"]


def grads_by_full_backward_hook(model: nn.Module, x: torch.Tensor, names):
    """PyTorch's own register_full_backward_hook, the oracle for the tensor mechanism."""
    seen = {}
    modules = dict(model.named_modules())
    for name in names:
        def hook(_m, grad_input, grad_output, name=name):
            seen[(name, "grad_input")] = [g.clone() if g is not None else None for g in grad_input]
            seen[(name, "grad_output")] = [g.clone() for g in grad_output]
        modules[name].register_full_backward_hook(hook)
    model(x).sum().backward()
    return seen


@pytest.mark.parametrize("mechanism", ["tensor", "module"])
def test_full_backward_matches_register_full_backward_hook(run_with, mechanism):
    run_dir = run_with("model=convnet", "data.requires_grad=true", "hooks=full_backward",
                       f"hooks.full_backward.mechanism={mechanism}")
    torch.manual_seed(0)
    x = seeded_batch([1, 3, 8, 8]).requires_grad_(True)
    seen = grads_by_full_backward_hook(ConvNet(), x, CONVNET_LEAVES)
    rows = stats_of(run_dir, hook="full_backward")
    assert len(rows) == len(CONVNET_LEAVES) * 2
    for row in rows.itertuples():
        expected = seen[(row.layer, row.kind)][int(row.slot)].double()
        assert row.l2 == pytest.approx(expected.norm().item(), rel=1e-6)
        assert row.max == pytest.approx(expected.max().item(), rel=1e-6)


def test_full_backward_replace_42_as_in_tutorial(run_with):
    run_dir = run_with("model=linear", "data.requires_grad=true", "hooks=full_backward",
                       "hooks.full_backward.layers=''", "hooks.full_backward.replace=42")
    m = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    m.register_full_backward_hook(lambda _m, gi, go: [torch.ones_like(g) * 42.0 for g in gi])
    m(x).sum().backward()
    assert torch.equal(x.grad, torch.full((2, 3), 42.0))  # the tutorial's output
    grad_in = stats_of(run_dir, kind="grad_input").iloc[0]
    assert grad_in["min"] == grad_in["max"] == 42.0 and grad_in.numel == 6


def test_full_backward_works_on_stock_resnet_where_pytorch_raises(run_with, tmp_path):
    """bn1 is followed by ReLU(inplace=True): PyTorch's full backward hook raises there."""
    shape = [2, 3, 32, 32]
    overrides = ["model=resnet18", "data.shape=[2,3,32,32]", "hooks=full_backward",
                 "hooks.full_backward.layers=[bn1,layer1.0.bn2]"]
    with pytest.raises(ConfigError, match="mechanism=module.*use mechanism=tensor"):
        run(make_config(*overrides, "hooks.full_backward.mechanism=module"), tmp_path / "module")
    assert not (tmp_path / "module").exists() or not list((tmp_path / "module").glob("*.parquet"))

    run_dir = run_with(*overrides)
    torch.manual_seed(0)
    reference = torchvision.models.resnet18()
    for m in reference.modules():  # the only way PyTorch's hook works on bn1; same numbers
        if hasattr(m, "inplace"):
            m.inplace = False
    seen = grads_by_full_backward_hook(reference, seeded_batch(shape), ["bn1"])
    for row in stats_of(run_dir, layer="bn1").itertuples():
        expected = seen[("bn1", row.kind)][int(row.slot)].double()
        assert row.l2 == pytest.approx(expected.norm().item(), rel=1e-6)
    assert set(stats_of(run_dir, layer="layer1.0.bn2").kind) == {"grad_input", "grad_output"}


def test_backward_pre_replace_changes_upstream_gradients_like_pytorch(run_with):
    run_dir = run_with("model=convnet", "hooks=[backward_pre,post_accumulate]", "hooks.backward_pre.layers=fc",
                       "hooks.backward_pre.replace=0.5", "hooks.backward_pre.mechanism=module")
    torch.manual_seed(0)
    net = ConvNet()
    net.fc.register_full_backward_pre_hook(lambda _m, go: (torch.full_like(go[0], 0.5),))
    net(seeded_batch([1, 3, 8, 8])).sum().backward()
    rows = stats_of(run_dir, hook="post_accumulate")
    for row in rows.itertuples():
        grad = getattr(dict(net.named_modules())[row.layer], row.slot).grad.double()
        assert row.l2 == pytest.approx(grad.norm().item(), rel=1e-6)
    assert stats_of(run_dir, hook="backward_pre").iloc[0]["mean"] == 0.5


def test_tensor_gradient_hooks_on_outputs_and_inputs(run_with):
    run_dir = run_with("model=convnet", "hooks=[double_grad,stats]", "hooks.double_grad.layers=relu",
                       "hooks.stats.layers=conv", "hooks.stats.kinds=[grad_output]",
                       "+hooks.tap_in={type:replace,target:input,layers:fc,value:42.0}")
    torch.manual_seed(0)
    net = ConvNet()
    grads = {}

    def double(_m, _i, out):
        out.register_hook(lambda g: g * 2)

    def keep_conv_grad(_m, _i, out):
        out.register_hook(lambda g: grads.__setitem__("conv", g.clone()))

    def fc_input_42(_m, args):
        view = args[0].view_as(args[0])
        view.register_hook(lambda g: torch.full_like(g, 42.0))
        return (view,)

    net.relu.register_forward_hook(double)
    net.conv.register_forward_hook(keep_conv_grad)
    net.fc.register_forward_pre_hook(fc_input_42)
    net(seeded_batch([1, 3, 8, 8])).sum().backward()
    conv = stats_of(run_dir, hook="stats").iloc[0]
    assert conv.l2 == pytest.approx(grads["conv"].double().norm().item(), rel=1e-6)
    tap = stats_of(run_dir, hook="tap_in").iloc[0]
    assert tap.kind == "grad_input" and tap["min"] == tap["max"] == 42.0


def test_residual_output_edit_matches_tutorial(run_with):
    run_dir = run_with("model=linear", "loss=none", "hooks=[residual,extract]", "hooks.extract.layers=''")
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    x = seeded_batch([2, 3])
    m.register_forward_hook(lambda _m, inputs, output: output + inputs[0])
    with torch.no_grad():
        expected = m(x)
    np.testing.assert_array_equal(analysis.load_tensors(run_dir).tensor[0], expected.numpy())


def test_keyword_inputs_are_recorded_and_shifted_with_kwargs(run_with):
    common = ["model=custom", "model._target_=models_for_tests.KwargsNet", "data.shape=[2,3]", "loss=none"]
    run_dir = run_with(*common, "hooks=[shift,extract]", "hooks.shift.layers=scale", "hooks.shift.kwarg=hidden",
                       "hooks.shift.value=10", "hooks.extract.layers=scale", "hooks.extract.kinds=[input,output]")
    net = KwargsNet.instances[-1]
    x = seeded_batch([2, 3])
    with torch.no_grad():
        expected = (net.fc1(x) + 10) * 3.0
    tensors = analysis.load_tensors(run_dir).set_index(["kind", "slot"])
    np.testing.assert_allclose(tensors.loc[("input", "hidden"), "tensor"], (net.fc1(x) + 10).detach().numpy())
    np.testing.assert_allclose(tensors.loc[("output", "0"), "tensor"], expected.numpy())
    assert ("input", "factor") not in tensors.index  # a float keyword is not a tensor


def test_global_hooks_see_modules_created_in_forward_and_are_removed(run_with):
    before = dict(torch.nn.modules.module._global_forward_hooks)
    run_dir = run_with("model=custom", "model._target_=models_for_tests.MakesModules", "data.shape=[2,3]",
                       "hooks=global_stats")
    rows = stats_of(run_dir, hook="global_stats")
    assert set(rows.layer) == {"", "fc", "<Tanh>"}
    assert set(rows[rows.layer == "<Tanh>"].kind) == {"output", "grad_output"}
    net = MakesModules.instances[-1]
    x = seeded_batch([2, 3])
    assert rows[(rows.layer == "<Tanh>") & (rows.kind == "output")]["mean"].item() == pytest.approx(
        torch.tanh(net.fc(x)).double().mean().item(), rel=1e-6)
    assert torch.nn.modules.module._global_forward_hooks == before and hook_count(net) == 0


def test_post_accumulate_records_accumulated_grad_and_sgd_updates(run_with):
    run_dir = run_with("model=mlp", "steps=2", "hooks=post_accumulate", "hooks.post_accumulate.op=sgd",
                       "hooks.post_accumulate.lr=0.1")
    torch.manual_seed(0)
    from runner.sources.models import MLP
    net = MLP()
    for p in net.parameters():
        def update(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None
        p.register_post_accumulate_grad_hook(update)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(2):
        x = torch.randn([1, 100], generator=gen)
        torch.randint(0, 5, (1,), generator=gen)  # the runner draws targets after each batch
        loss = net(x).sum()
        loss.backward()
        losses.append(loss.item())
    assert analysis.load_steps(run_dir).loss.tolist() == pytest.approx(losses, rel=1e-6)
    assert losses[0] != losses[1]
    assert len(stats_of(run_dir, hook="post_accumulate", step=0)) == 4


def test_post_accumulate_rejects_a_computed_weight(tmp_path):
    overrides = ["model=custom", "model._target_=models_for_tests.ParametrizedNet", "data.shape=[2,3]",
                 "hooks=post_accumulate", "hooks.post_accumulate.layers=fc", "hooks.post_accumulate.params=[weight]"]
    with pytest.raises(ConfigError, match=r"'fc.weight' is computed in forward \(not a leaf tensor\)"):
        run(make_config(*overrides), tmp_path / "out")


@pytest.mark.parametrize("mode, layers", [("offload_cpu", "**"), ("offload_disk", "**"), ("compress", "layer1")])
def test_saved_tensor_hooks_keep_gradients_and_record_packed_bytes(tmp_path, monkeypatch, mode, layers):
    loaded = []  # what backward read back from disk: proves offload_disk really went through files
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loaded.append(a[0]) or load(*a, **k))
    grads = {}
    for hooks in ("none", "offload"):
        TrackedResNet18.instances.clear()
        extra = [f"hooks.offload.mode={mode}", f"hooks.offload.layers={layers}",
                 f"hooks.offload.directory={tmp_path}"] if hooks == "offload" else []
        cfg = make_config(f"hooks={hooks}", "model=resnet18", "+model._target_=models_for_tests.TrackedResNet18",
                          "data.shape=[2,3,32,32]", *extra)
        out = run(cfg, tmp_path / hooks)
        grads[hooks] = [p.grad for p in TrackedResNet18.instances[0].parameters()]
    for a, b in zip(grads["none"], grads["offload"]):
        if mode == "compress":  # lossy: fp16 keeps ~3 significant digits
            assert (a - b).abs().max() <= 5e-3 * a.abs().max()
        else:  # unpack(pack(x)) == x exactly
            assert torch.equal(a, b)
    saved = stats_of(out, hook="offload")
    assert (saved.kind == "saved").all() and len(saved) > 10
    if mode == "compress":
        assert set(saved[saved.dtype != "int64"].dtype) <= {"float16"}
    if mode == "offload_disk":  # every saved tensor was read back from its own file, inside tmp_path
        run_files = {p for p in loaded if str(p).startswith(str(tmp_path))}
        assert len(run_files) == len(saved)
    assert not any(tmp_path.glob("saved-tensors-*"))  # disk files and their folder are gone


def test_saved_tensor_pack_count_matches_hand_written_hooks(run_with):
    run_dir = run_with("model=convnet", "hooks=offload", "hooks.offload.layers=conv")
    torch.manual_seed(0)
    net = ConvNet()
    packed = []
    x = seeded_batch([1, 3, 8, 8])
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        out = net.conv(x)
    net.fc(net.flatten(net.relu(out))).sum().backward()
    saved = stats_of(run_dir, hook="offload")
    assert [list(s) for s in saved["tensor_shape"]] == [list(s) for s in packed]


def test_node_hooks_see_the_output_gradient_and_fire_in_pytorch_order(run_with):
    run_dir = run_with("model=linear", "'hooks=[stats,node,post_accumulate]'".strip("'"),
                       "hooks.stats.layers=''", "hooks.stats.kinds=[grad_output]",
                       "hooks.node.layers=''", "hooks.post_accumulate.layers=''")
    rows = stats_of(run_dir, phase="backward")
    order = [k for i, k in enumerate(zip(rows.hook, rows.kind)) if i == 0 or k != (rows.hook[i - 1], rows.kind[i - 1])]
    # tensor hook -> Node pre-hook -> Node post-hook -> post-accumulate-grad hooks (leaves, after the Node)
    assert order == [("stats", "grad_output"), ("node", "grad_output"), ("node", "grad_input"),
                     ("post_accumulate", "param_grad")]
    tensor_hook, node_pre = rows.iloc[0], rows.iloc[1]
    assert tensor_hook.l2 == node_pre.l2 and tensor_hook["mean"] == node_pre["mean"]


def test_entries_fire_in_config_order_and_prepend_goes_first(run_with):
    def order(*extra):
        run_dir = run_with("model=linear", "hooks=[print,double_grad,print_grad]", "hooks.print.kinds=[grad_output]",
                           "hooks.print.layers=''", *extra)
        rows = stats_of(run_dir, phase="backward")
        return [(h, r) for h, r in zip(rows.hook, rows["mean"])]

    plain = order()
    assert [h for h, _ in plain] == ["print", "double_grad", "print_grad"]
    assert plain[0][1] * 2 == plain[1][1] == plain[2][1]   # print saw the gradient before doubling
    first = order("hooks.print_grad.prepend=true")
    assert [h for h, _ in first] == ["print_grad", "print", "double_grad"]
    assert first[0][1] * 2 == first[2][1]


def test_always_call_forward_hook_runs_when_forward_raises(tmp_path, capsys):
    cfg = make_config("model=custom", "model._target_=models_for_tests.Exploding", "data.shape=[2,3]",
                      "hooks=print", "hooks.print.layers=''", "hooks.print.always_call=true")
    with pytest.raises(RuntimeError, match="boom"):
        run(cfg, tmp_path / "out")
    assert "(model): no output (forward raised)" in capsys.readouterr().out


def test_observers_leave_outputs_and_gradients_bit_identical(tmp_path):
    observers = "hooks=[stats,extract,print,full_backward,backward_pre,node,global_stats,post_accumulate,print_grad]"
    models = {}
    for hooks in ("hooks=none", observers):
        TrackedResNet18.instances.clear()
        run(make_config(hooks, "model=resnet18", "+model._target_=models_for_tests.TrackedResNet18",
                        "data.shape=[2,3,32,32]"), tmp_path / str(len(models)))
        models[hooks] = TrackedResNet18.instances[0]
    for a, b in zip(models["hooks=none"].parameters(), models[observers].parameters()):
        assert torch.equal(a.grad, b.grad)
    assert all(hook_count(m) == 0 for m in models.values())


def test_a_hook_returning_the_wrong_shape_is_named(tmp_path, monkeypatch):
    from dataclasses import dataclass

    from hooks.mechanism.registry import HOOK_TYPES, register
    from hooks.mechanism.tap import Tap, TapSpec

    @dataclass
    class BadSpec(TapSpec):
        pass

    monkeypatch.setattr(HOOK_TYPES, "_entries", dict(HOOK_TYPES._entries))  # the type is gone after the test

    @register("bad_shape_for_test")
    class Bad(Tap):
        spec_class = BadSpec

        def edit_output(self):
            return lambda out, args: out[..., :1]

    cfg = make_config("model=convnet", "+hooks.bad={type:bad_shape_for_test,layers:fc}")
    with pytest.raises(ConfigError, match=r"hooks.bad on 'fc' output: returned float32 \[1, 1\] in place of "
                                          r"float32 \[1, 5\]"):
        run(cfg, tmp_path / "out")
