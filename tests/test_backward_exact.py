"""Backward hooks from config against the same hooks written by hand (issue 12): firing order and
chaining, ``call`` numbering, and in-place modules against a copy with in-place ops turned off."""
from __future__ import annotations

import contextlib
import copy
import types

import pytest
import torch
import torchvision
from torch import nn

from conftest import hook_count, seeded_batch, stats_of
from common.errors import ConfigError
from hooks import HookSession, build_hooks
from hooks.types.backward import FullBackward
from models_for_tests import CalledTwice

pytestmark = pytest.mark.statistics

MECHANISMS = ["tensor", "module"]


def hooked_step(model: nn.Module, x, entries: dict, loss=lambda out: out.sum(), call=None) -> list[dict]:
    """One forward (``model(x)``, or ``call(model)``) and backward with ``entries`` attached; every
    recorded row, in recording order, with its kept tensor (``capture`` entries) under ``tensor``.
    The model keeps no hook."""
    with HookSession(model, build_hooks(entries)) as session:
        loss(model(x) if call is None else call(model)).backward()
        session.after_backward()
        caps = session.recorder.drain()
    assert hook_count(model) == 0
    kept = dict(zip(caps.kept_rows, caps.kept))
    cols = caps.columns
    return [{**{c: cols[c][i] for c in ("hook", "layer", "phase", "kind", "slot", "call", "tensor_shape")},
             "mean": caps.stats["mean"][i], "l2": caps.stats["l2"][i], "tensor": kept.get(i)}
            for i in range(len(caps))]


def hooks_in_order(rows: list[dict], kind: str) -> list[str]:
    return [r["hook"] for r in rows if r["kind"] == kind]


# -- order and chaining ---------------------------------------------------------------------
def test_issue_reproduction_observer_listed_after_replace_sees_42(run_with):
    run_dir = run_with("model=linear", "data.requires_grad=true", "hooks=full_backward",
                       "hooks.full_backward.layers=''", "hooks.full_backward.replace=42",
                       "+hooks.obs={type:full_backward,layers:'',mechanism:tensor}")
    seen = []
    m = nn.Linear(3, 3)
    m.register_full_backward_hook(lambda _m, gi, go: tuple(torch.full_like(g, 42.0) for g in gi))
    m.register_full_backward_hook(lambda _m, gi, go: seen.append(gi[0].clone()))
    m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    obs = stats_of(run_dir, hook="obs", kind="grad_input").iloc[0]
    assert obs["min"] == obs["max"] == seen[0].min().item() == seen[0].max().item() == 42.0


PREPEND = [False, True, False, False, True]  # PyTorch's test_full_backward_hooks pattern


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("hook_type, register", [("full_backward", "register_full_backward_hook"),
                                                 ("backward_pre", "register_full_backward_pre_hook")])
def test_entries_fire_in_pytorch_order_with_prepend(mechanism, hook_type, register):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    fired = []
    reference = copy.deepcopy(model)
    for i, prepend in enumerate(PREPEND):
        getattr(reference[0], register)(lambda *_, i=i: fired.append(f"e{i}"), prepend=prepend)
    x = torch.randn(2, 4, requires_grad=True)
    reference(x).sum().backward()
    entries = {f"e{i}": {"type": hook_type, "layers": "0", "mechanism": mechanism, "prepend": p}
               for i, p in enumerate(PREPEND)}
    rows = hooked_step(model, x, entries)
    assert fired == ["e4", "e1", "e0", "e2", "e3"]
    assert hooks_in_order(rows, "grad_output") == fired
    if hook_type == "full_backward":
        assert hooks_in_order(rows, "grad_input") == fired


@pytest.mark.parametrize("target, register", [("input", "register_full_backward_hook"),
                                              ("output", "register_full_backward_pre_hook")])
def test_each_entry_sees_what_the_previous_returned(target, register):
    """[observe, x2, observe, x3 (prepend)] fire as x3, observe, x2, observe: 3g then 6g."""
    kind = f"grad_{target}"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    reference = copy.deepcopy(model)
    seen = {}

    def observe(name):
        def hook(_m, *grads):
            seen[name] = grads[0][0].clone()  # grad_input for full hooks, grad_output for pre-hooks
        return hook

    def scale(factor):
        def hook(_m, *grads):
            return tuple(g * factor for g in grads[0])
        return hook

    for hook, prepend in [(observe("a"), False), (scale(2.0), False), (observe("b"), False), (scale(3.0), True)]:
        getattr(reference[0], register)(hook, prepend=prepend)
    x = torch.randn(2, 4, requires_grad=True)
    reference(x).sum().backward()
    expected_grad = x.grad.clone()
    x.grad = None
    rows = hooked_step(model, x, {
        "a": {"type": "capture", "layers": "0", "kinds": [kind]},
        "x2": {"type": "scale", "target": target, "layers": "0", "factor": 2.0},
        "b": {"type": "capture", "layers": "0", "kinds": [kind]},
        "x3": {"type": "scale", "target": target, "layers": "0", "factor": 3.0, "prepend": True},
    })
    assert hooks_in_order(rows, kind) == ["x3", "a", "x2", "b"]
    got = {r["hook"]: r["tensor"] for r in rows if r["tensor"] is not None}
    torch.testing.assert_close(got["a"], seen["a"], rtol=0, atol=0)
    torch.testing.assert_close(got["b"], seen["b"], rtol=0, atol=0)
    torch.testing.assert_close(x.grad, expected_grad, rtol=0, atol=0)


def test_parameter_entries_fire_prepend_first_and_chain():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = copy.deepcopy(model)
    reference.bias.register_hook(lambda g: g * 3)  # the prepended entry, first
    reference.bias.register_hook(lambda g: g * 2)
    x = torch.randn(4, 3)
    reference(x).sum().backward()
    rows = hooked_step(model, x, {
        "x2": {"type": "scale", "layers": "", "params": ["bias"], "factor": 2.0},
        "x3": {"type": "scale", "layers": "", "params": ["bias"], "factor": 3.0, "prepend": True},
    })
    backward = [r for r in rows if r["phase"] == "backward"]
    assert [r["hook"] for r in backward] == ["x3", "x2"]
    plain = (torch.ones(4, 2)).sum(0).double()  # d sum / d bias
    assert backward[0]["mean"] == pytest.approx((3 * plain).mean().item())
    assert backward[1]["mean"] == pytest.approx((6 * plain).mean().item())
    torch.testing.assert_close(model.bias.grad, reference.bias.grad, rtol=0, atol=0)


def test_mixing_mechanisms_on_one_module_with_an_edit_fails_before_running():
    model = nn.Linear(3, 3)
    hooks = build_hooks({"r": {"type": "full_backward", "layers": "", "replace": 1.0},
                         "m": {"type": "full_backward", "layers": "", "mechanism": "module"}})
    with pytest.raises(ConfigError, match=r"hooks.r \(mechanism=tensor\) and hooks.m \(mechanism=module\) "
                                          r"on '': .*give both the same mechanism"):
        with HookSession(model, hooks):
            pass
    assert hook_count(model) == 0


# -- call numbering -------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_module_called_twice_backward_rows_join_forward_rows_on_call(mechanism):
    torch.manual_seed(0)
    model = CalledTwice()
    x = torch.randn(2, 3)
    inputs, outputs = [], []  # plain PyTorch: each call's input and output, then autograd.grad
    h1 = model.fc.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    h2 = model.fc.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    x_leaf = x.clone().requires_grad_(True)
    loss = model(x_leaf).sum()
    grads = torch.autograd.grad(loss, inputs + outputs)
    h1.remove(), h2.remove()
    expected = {(c, "input"): inputs[c] for c in (0, 1)}
    expected |= {(c, "grad_input"): grads[c] for c in (0, 1)}
    expected |= {(c, "grad_output"): grads[2 + c] for c in (0, 1)}

    rows = hooked_step(model, x.clone().requires_grad_(True), {
        "inputs": {"type": "capture", "layers": "fc", "kinds": ["input"]},
        "grads": {"type": "full_backward", "layers": "fc", "mechanism": mechanism},
    })
    assert len(rows) == 6
    for r in rows:
        want = expected[(r["call"], r["kind"])].double()
        if r["tensor"] is not None:
            torch.testing.assert_close(r["tensor"], inputs[r["call"]].detach(), rtol=0, atol=0)
        assert r["mean"] == pytest.approx(want.mean().item(), rel=1e-6)
        assert r["l2"] == pytest.approx(want.norm().item(), rel=1e-6)
    assert expected[(0, "grad_output")].mean() * 3 == pytest.approx(expected[(1, "grad_output")].mean().item())


# -- in-place modules -----------------------------------------------------------------------
def inplace_off(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with the same weights, every ``inplace`` flag turned off and each
    torchvision ``BasicBlock`` adding its shortcut out of place (``out + identity``), so
    PyTorch's full backward hooks work on every module of it."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if getattr(m, "inplace", False):
            m.inplace = False
        if isinstance(m, torchvision.models.resnet.BasicBlock):
            m.forward = types.MethodType(basic_block_out_of_place, m)
    return twin


def basic_block_out_of_place(self, x: torch.Tensor) -> torch.Tensor:
    """torchvision's ``BasicBlock.forward`` with ``out += identity`` written ``out = out + identity``."""
    identity = x if self.downsample is None else self.downsample(x)
    out = self.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    return self.relu(out + identity)


def full_backward_by_call(model: nn.Module, x, names) -> dict:
    """PyTorch's register_full_backward_hook on each named module: ``{(layer, kind, slot): [grads]}``."""
    seen: dict = {}
    modules = dict(model.named_modules())
    handles = []
    for name in names:
        def hook(_m, grad_input, grad_output, name=name):
            for kind, grads in (("grad_input", grad_input), ("grad_output", grad_output)):
                for i, g in enumerate(grads):
                    if g is not None:
                        seen.setdefault((name, kind, str(i)), []).append(g.clone())
        handles.append(modules[name].register_full_backward_hook(hook))
    model(x).sum().backward()
    for h in handles:
        h.remove()
    return seen


def test_stock_resnet18_every_gradient_matches_its_inplace_off_copy():
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    reference = inplace_off(model)
    x = seeded_batch([2, 3, 32, 32])
    leaves = [n for n, m in model.named_modules() if not any(m.children())]
    expected = full_backward_by_call(reference, x, leaves)
    rows = hooked_step(model, x, {"g": {"type": "capture", "layers": "leaf:**",
                                        "kinds": ["grad_input", "grad_output"]}})
    assert len(rows) == sum(len(v) for v in expected.values()) == 119
    relu_inputs = [r for r in rows if r["kind"] == "grad_input" and r["layer"].endswith("relu")]
    assert len(relu_inputs) == 17  # the rows an in-place ReLU used to lose
    for r in rows:
        candidates = expected[(r["layer"], r["kind"], r["slot"])]
        assert any(torch.equal(r["tensor"], g) for g in candidates), (r["layer"], r["kind"], r["call"])


def test_clamp_on_an_inplace_relu_input_applies_like_pytorch():
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    reference = inplace_off(model)
    x = seeded_batch([2, 3, 32, 32])
    reference.layer1[0].relu.register_full_backward_hook(
        lambda _m, gi, go: tuple(g.clamp(min=0) for g in gi))
    reference(x).sum().backward()
    rows = hooked_step(model, x, {"clip": {"type": "clamp", "target": "input", "layers": "layer1.0.relu",
                                           "min": 0.0, "max": None}})
    assert [(r["kind"], r["call"]) for r in rows if r["kind"] != "clipped"] == [("grad_input", 1), ("grad_input", 0)]
    assert sorted(r["call"] for r in rows if r["kind"] == "clipped") == [0, 1]  # what the clamp removed, per call
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    plain = inplace_off(model)
    for p in plain.parameters():
        p.grad = None
    plain(x).sum().backward()
    assert not torch.equal(plain.conv1.weight.grad, model.conv1.weight.grad)  # the clamp changed something


def test_clip_cli_reproduction_records_the_clamped_gradient(run_with):
    run_dir = run_with("model=resnet18", "data.shape=[2,3,32,32]", "hooks=clip", "hooks.clip.target=input",
                       "hooks.clip.layers=layer1.0.relu", "hooks.clip.min=0", "hooks.clip.max=null")
    rows = stats_of(run_dir, hook="clip", kind="grad_input")
    assert sorted(rows.call) == [0, 1] and (rows["min"] >= 0).all()
    removed = stats_of(run_dir, hook="clip", kind="clipped")  # grad - clamped: what min=0 took away, never above 0
    assert sorted(removed.call) == [0, 1] and (removed["max"] <= 0).all()


class MutatesInput(nn.Module):
    """Changes its input in place without an ``inplace`` attribute saying so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)


@pytest.mark.parametrize("model, layer", [
    (nn.Sequential(nn.Linear(3, 3), MutatesInput(), nn.Linear(3, 1)), "1"),
    (nn.Sequential(nn.Linear(3, 3), nn.Identity(), nn.ReLU(inplace=True), nn.Linear(3, 1)), "1"),
], ids=["module-mutates-its-input", "identity-then-inplace"])
@pytest.mark.parametrize("entry", [{"type": "stats", "kinds": ["grad_input", "grad_output"]},
                                   {"type": "clamp", "target": "input", "min": 0.0}], ids=["observer", "edit"])
def test_a_hook_pytorch_drops_fails_in_one_line(model, layer, entry):
    with pytest.raises(ConfigError, match=rf"hooks.g: PyTorch dropped the grad_input hook of '{layer}' slot 0"):
        hooked_step(model, torch.randn(2, 3), {"g": {**entry, "layers": layer}})
    assert hook_count(model) == 0


def test_mechanism_module_explains_pytorchs_inplace_error(tmp_path):
    model = torchvision.models.resnet18()
    (hook,) = build_hooks({"fb": {"type": "full_backward", "layers": "bn1", "mechanism": "module"}})
    with pytest.raises(RuntimeError, match="BackwardHookFunction") as err:
        hooked_step(model, torch.randn(2, 3, 32, 32), {"fb": {"type": "full_backward", "layers": "bn1",
                                                              "mechanism": "module"}})
    assert hook.explain(err.value).startswith("hooks.fb.mechanism=module: PyTorch's full backward hook fails")
    assert hook.explain(RuntimeError("something else")) is None
    (tensor_hook,) = build_hooks({"fb": {"type": "full_backward", "layers": "bn1"}})
    assert isinstance(tensor_hook, FullBackward) and tensor_hook.explain(err.value) is None


def test_mechanism_module_refuses_a_dict_output_it_would_never_see():
    class DictOut(nn.Module):
        def forward(self, x):
            return {"y": x * 2}

    model = nn.Sequential(DictOut())
    with pytest.raises(ConfigError, match=r"hooks.fb.mechanism=module: '0' returns dict"):
        hooked_step(model, torch.randn(2, 3, requires_grad=True),
                    {"fb": {"type": "full_backward", "layers": "0", "mechanism": "module"}},
                    loss=lambda out: out["y"].sum())
    rows = hooked_step(model, torch.randn(2, 3, requires_grad=True),
                       {"fb": {"type": "full_backward", "layers": "0"}}, loss=lambda out: out["y"].sum())
    assert {(r["kind"], r["slot"]) for r in rows} == {("grad_input", "0"), ("grad_output", "y")}


def test_a_dropped_hook_fails_before_the_first_step_from_the_cli(fault):
    outcome = fault("model=custom", "model._target_=models_for_tests.IdentityThenInplace", "data.shape=[2,3]",
                    "hooks=full_backward", "hooks.full_backward.layers=id")
    assert outcome.code != 0
    assert "hooks.full_backward: PyTorch dropped the grad_input hook of 'id' slot 0" in outcome.stderr


@pytest.mark.parametrize("entry, missing", [
    ({"type": "stats", "layers": "conv", "kinds": ["grad_input", "grad_output"]}, ["grad_input"]),
    ({"type": "full_backward", "layers": "conv", "mechanism": "module"}, ["grad_input"]),
    ({"type": "node", "layers": "fc"}, []),
    ({"type": "clamp", "layers": "fc", "target": "params", "min": 0.0}, []),
])
def test_silent_names_what_a_matched_entry_never_recorded(entry, missing):
    """The first layer's input needs no gradient: PyTorch gives no grad_input there (None)."""
    from runner.sources.models import ConvNet

    model = ConvNet()
    (hook,) = build_hooks({"e": entry})
    with (pytest.warns(UserWarning, match="no inputs require gradients") if entry["type"] == "full_backward"
          else contextlib.nullcontext()):
        with HookSession(model, [hook]) as session:
            session.backward(model(torch.randn(1, 3, 8, 8)).sum())
            assert sorted({silence.kind for silence in session.silent()}) == missing


def lstm_grads(edits: dict[int, float] | None = None, entry: dict | None = None) -> tuple[list, list[dict]]:
    """Parameter gradients of ``Recurrent`` after one backward, with each output slot's gradient
    scaled by hand (``edits``: tensor position in ``(output, h_n, c_n)`` -> factor) or by ``entry``."""
    from models_for_tests import Recurrent

    torch.manual_seed(0)
    model = Recurrent()
    x = seeded_batch([2, 5, 3])
    if entry is not None:
        rows = hooked_step(model, x, {"g": entry})
        return [p.grad for p in model.parameters()], rows

    def by_hand(_module, _args, output):
        tensors = (output[0], *output[1])
        for position, factor in (edits or {}).items():
            tensors[position].register_hook(lambda g, factor=factor: g * factor)

    model.lstm.register_forward_hook(by_hand)
    model(x).sum().backward()
    return [p.grad for p in model.parameters()], []


@pytest.mark.parametrize("slot, position", [(0, 0), (1.0, 1), ("1.0", 1)])
def test_a_gradient_edit_with_a_slot_changes_that_output_tensors_gradient_only(slot, position):
    """``scale`` on an LSTM with ``slot``: as a hand-written hook on that one tensor of
    ``(output, (h_n, c_n))``; the gradient of the other tensor that gets one is left as it was."""
    want, _ = lstm_grads({position: 3.0})
    got, rows = lstm_grads(entry={"type": "scale", "layers": "lstm", "target": "output", "factor": 3.0,
                                  "slot": slot})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    plain, _ = lstm_grads({})
    assert not torch.equal(got[0], plain[0])  # the edit changed something
    assert {(r["kind"], r["slot"]) for r in rows} == {("grad_output", ["0", "1.0"][position])}


def test_a_gradient_edit_without_a_slot_changes_every_output_tensors_gradient():
    want, _ = lstm_grads({0: 3.0, 1: 3.0, 2: 3.0})
    got, rows = lstm_grads(entry={"type": "scale", "layers": "lstm", "target": "output", "factor": 3.0})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert {r["slot"] for r in rows} == {"0", "1.0"}  # c_n gets no gradient here


def test_a_gradient_edit_slot_the_output_lacks_or_on_parameters_is_one_line():
    with pytest.raises(ConfigError, match=r"^hooks.g.slot: unknown output slot of 'lstm' '1.2'; "
                                          r"valid: 0, 1.0, 1.1; did you mean '1.1'\?$"):
        lstm_grads(entry={"type": "scale", "layers": "lstm", "target": "output", "slot": "1.2"})
    with pytest.raises(ConfigError, match=r"hooks.g.slot: only meaningful with target=output or input"):
        build_hooks({"g": {"type": "clamp", "min": 0.0, "slot": 0}})


def test_a_gradient_edit_slot_the_module_lacks_fails_before_the_first_step_from_the_cli(fault):
    outcome = fault("model=custom", "model._target_=models_for_tests.Recurrent", "data.shape=[2,5,3]",
                    "hooks=double_grad", "hooks.double_grad.target=output", "hooks.double_grad.layers=lstm",
                    "hooks.double_grad.slot=2")
    assert outcome.code == 2
    assert outcome.stderr.endswith("hooks.double_grad.slot: unknown output slot of 'lstm' '2'; valid: 0, 1.0, 1.1")


def test_a_gradient_edit_with_a_slot_changes_that_inputs_gradient_only():
    """``clamp`` on the second input of a ``Bilinear``: as a hand-written hook on that input alone."""
    torch.manual_seed(0)
    bilinear = nn.Bilinear(3, 4, 2)
    x1, x2 = seeded_batch([5, 3], 0).requires_grad_(), seeded_batch([5, 4], 1).requires_grad_()
    hooked_step(bilinear, None, {"g": {"type": "clamp", "layers": "", "target": "input", "slot": 1,
                                       "min": -0.1, "max": 0.1}}, call=lambda m: m(x1, x2))
    got = x1.grad, x2.grad
    x1.grad = x2.grad = None
    second = x2.view_as(x2)
    second.register_hook(lambda g: g.clamp(-0.1, 0.1))
    bilinear(x1, second).sum().backward()
    assert torch.equal(got[0], x1.grad) and torch.equal(got[1], x2.grad)
    assert x2.grad.abs().max() == 0.1 and x1.grad.abs().max() > 0.1  # clamped where asked, only there
