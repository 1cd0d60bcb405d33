"""PyTorch's own hook tests, ported: each scenario our config can express, run from config and
against the same hooks written by hand in plain PyTorch.

Upstream: ``test/nn/test_module_hooks.py`` (TestModuleHooks, TestModuleGlobalHooks,
TestModuleHookNN) and the hook tests of ``test/test_autograd.py``.

=================================================  ============================================
upstream test                                      here
=================================================  ============================================
test_forward_hooks                                 forward_hooks_prepend_order
test_forward_pre_hooks                             forward_pre_hooks_prepend_order
test_full_backward_hooks                           full_backward_prepend_order[tensor|module]
test_full_backward_pre_hooks                       backward_pre_prepend_order[...],
                                                   backward_pre_return_zeroes_upstream[...]
test_mixed_hooks                                   mixed_hooks[tensor|module]
test_kwarg_hooks (1: pre-hook doubles a kwarg)     kwarg_pre_hook_doubles_bias
test_kwarg_hooks (2, 3: forward hook reads         not expressible: no hook type reads kwargs in a
  kwargs)                                          forward hook (issue 12's ``custom`` type)
test_remove_kwarg_hooks, *_hook_removable,         not expressible: entries cannot remove their
  _test_hooks (remove midway)                      handles mid-run (issue 12's ``max_calls``)
test_bw_hook_warning_for_non_tensor_or_tuple       dict_output[tensor|module]: PyTorch warns and
                                                   skips; mechanism=module refuses in one line,
                                                   mechanism=tensor records every tensor
test_module_global_hooks                           global_full_backward_every_module
test_module_backward_global_hook_writeable         global_grad_input_times_two
test_module_global_forward_preforward_hook_        forward_edits_global (``mul 3`` stands for
  writeable, test_hook_forward_preforward_writable the upstream ``relu``: no relu op)
test_global_and_local_hooks_order                  global_before_local
test_hook_cpp                                      batchnorm1d_full_backward
test_backward_hooks_interaction                    pre_hook_result_reaches_full_hook[...]
test_hook_requires_grad                            input_without_grad[...]: no row for it (PyTorch
                                                   passes zeros)
test_hook_no_requires_grad                         no_input_requires_grad[...]: no grad_input row
                                                   (PyTorch passes None)
test_hook_last_arg_requires_grad                   last_arg_requires_grad
test_hook_extra_input                              non_tensor_input_and_output
test_hook_inplace                                  inplace_input_fails, inplace_after_output_works
test_hook_backward_size                            two_inputs_of_different_sizes
test_hook_backward_writeable (legacy hook)         grad_input_times_two
test_hook_invalid_outputs,                         not expressible: config hooks return checked
  test_module_global_hook_invalid_outputs          tensors (a wrong shape is named: test_hook_surface)
test_hook_non_full_warning                         not offered: the deprecated register_backward_hook
state-dict, buffer/module/parameter registration   not hook kinds of a training step
  hooks
test_autograd: test_hooks (tensor hooks on an      output_grad_times_two
  intermediate returning a new grad)
test_autograd: test_tensor_hooks_inplace           hook_before_inplace_stays_bound
test_autograd: test_tensor_hooks_inplace_over_     hook_on_view_modified_in_place_fails
  view
test_autograd: test_post_accumulate_grad_hook_     tensor_hook_then_post_accumulate (Node hooks
  ordering                                         on AccumulateGrad: not expressible)
test_autograd: Node pre/post hooks                 node_hooks_after_tensor_hooks
  (register_prehook / register_hook)
test_autograd: saved tensor pack/unpack            saved_tensors_identity_pack (custom pack/unpack
  (saved_tensors_hooks)                            pairs: issue 12's ``mode: custom``)
always_call forward hooks                          always_call_sees_no_output
=================================================  ============================================
"""
from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
from torch import nn

from common.errors import ConfigError
from test_backward_exact import hooked_step, hooks_in_order

pytestmark = pytest.mark.statistics

SCENARIOS = {}


def scenario(fn=None, *, mechanisms=False):
    """Register ``fn``; with ``mechanisms`` once per backward mechanism."""
    def deco(fn):
        for m in (["tensor", "module"] if mechanisms else [None]):
            SCENARIOS[fn.__name__ + (f"[{m}]" if m else "")] = (fn, m)
        return fn
    return deco(fn) if fn else deco


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq1 = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.seq2 = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    def forward(self, x):
        return self.seq2(self.seq1(x))


class Toy(nn.Module):
    """Upstream's ToyModel at a smaller size: net1 and net2, each seq1 and seq2 of two Linears."""

    def __init__(self):
        super().__init__()
        self.net1, self.net2 = Net(), Net()

    def forward(self, x):
        return self.net2(self.net1(x))


def toy() -> nn.Module:
    torch.manual_seed(0)
    return Toy()


def order_scenario(layer, hook_type, kind, register, prepend, expected, mechanism=None):
    model = toy()
    reference = copy.deepcopy(model)
    fired = []
    target = reference.get_submodule(layer)
    for i, p in enumerate(prepend):
        getattr(target, register)(lambda *_, i=i: fired.append(f"e{i}"), prepend=p)
    x = torch.randn(3, 4, requires_grad=True)
    reference(x).sum().backward()
    extra = {"mechanism": mechanism} if mechanism else {"kinds": [kind]}
    entries = {f"e{i}": {"type": hook_type, "layers": layer, "prepend": p, **extra} for i, p in enumerate(prepend)}
    rows = hooked_step(model, x, entries)
    assert fired == [f"e{i}" for i in expected]
    assert hooks_in_order(rows, kind) == fired


@scenario
def forward_hooks_prepend_order():
    order_scenario("net1.seq2", "stats", "output", "register_forward_hook",
                   [False, True, False, False, True], [4, 1, 0, 2, 3])


@scenario
def forward_pre_hooks_prepend_order():
    order_scenario("net2.seq1", "stats", "input", "register_forward_pre_hook",
                   [True, False, False, False, True], [4, 0, 1, 2, 3])


@scenario(mechanisms=True)
def full_backward_prepend_order(mechanism):
    order_scenario("net1", "full_backward", "grad_input", "register_full_backward_hook",
                   [False, False, False, True, True], [4, 3, 0, 1, 2], mechanism)


@scenario(mechanisms=True)
def backward_pre_prepend_order(mechanism):
    order_scenario("net1", "backward_pre", "grad_output", "register_full_backward_pre_hook",
                   [True, True, False, False, False], [1, 0, 2, 3, 4], mechanism)


@scenario(mechanisms=True)
def backward_pre_return_zeroes_upstream(mechanism):
    a = torch.ones(2, requires_grad=True)
    hooked_step(nn.Linear(2, 2), a, {"z": {"type": "backward_pre", "layers": "", "replace": 0.0,
                                           "mechanism": mechanism}})
    reference = nn.Linear(2, 2)
    reference.register_full_backward_pre_hook(lambda _m, go: (go[0] * 0,))
    b = torch.ones(2, requires_grad=True)
    reference(b).sum().backward()
    assert torch.equal(a.grad, b.grad) and torch.equal(a.grad, torch.zeros(2))


@scenario(mechanisms=True)
def mixed_hooks(mechanism):
    model = toy()
    reference = copy.deepcopy(model)
    fired = []
    reference.register_forward_pre_hook(lambda *_: fired.append("e0"))
    reference.register_forward_hook(lambda *_: fired.append("e1"))
    reference.register_full_backward_pre_hook(lambda *_: fired.append("e2"))
    reference.register_full_backward_hook(lambda *_: fired.append("e3"))
    x = torch.randn(3, 4, requires_grad=True)
    reference(x).sum().backward()
    rows = hooked_step(model, x, {"e0": {"type": "stats", "layers": "", "kinds": ["input"]},
                                  "e1": {"type": "stats", "layers": "", "kinds": ["output"]},
                                  "e2": {"type": "backward_pre", "layers": "", "mechanism": mechanism},
                                  "e3": {"type": "full_backward", "layers": "", "mechanism": mechanism}})
    ours = [r["hook"] for i, r in enumerate(rows) if i == 0 or r["hook"] != rows[i - 1]["hook"]]
    assert ours == fired == ["e0", "e1", "e2", "e3"]


class KwargModel(nn.Module):
    def forward(self, x, bias=None):
        return x if bias is None else x + bias


@scenario
def kwarg_pre_hook_doubles_bias():
    x, bias = torch.ones(4, 4, requires_grad=True), torch.ones(4, 4)
    reference = KwargModel()
    reference.register_forward_pre_hook(lambda _m, args, kwargs: (args, {**kwargs, "bias": 2 * kwargs["bias"]}),
                                        with_kwargs=True)
    expected = reference(x, bias=bias)
    rows = hooked_step(KwargModel(), None, {
        "double": {"type": "shift", "layers": "", "kwarg": "bias", "op": "mul", "value": 2.0},
        "out": {"type": "capture", "layers": "", "kinds": ["output"]}}, call=lambda m: m(x, bias=bias))
    (out,) = [r["tensor"] for r in rows if r["hook"] == "out"]
    assert torch.equal(out, expected.detach()) and torch.equal(out, (x + 2 * bias).detach())


class DictOut(nn.Module):
    def forward(self, x):
        return {"x": torch.softmax(x, dim=0)}


@scenario(mechanisms=True)
def dict_output(mechanism):
    reference, counter = DictOut(), []
    reference.register_full_backward_hook(lambda *_: counter.append(1))
    with pytest.warns(UserWarning, match="should be a Tensor or a tuple of Tensors"):
        reference({"x": torch.ones(2, requires_grad=True)}["x"])["x"].sum().backward()
    assert counter == []  # PyTorch skipped the hook
    run = lambda: hooked_step(nn.Sequential(DictOut()), torch.ones(2, requires_grad=True),  # noqa: E731
                              {"fb": {"type": "full_backward", "layers": "0", "mechanism": mechanism}},
                              loss=lambda out: out["x"].sum())
    if mechanism == "module":
        with pytest.raises(ConfigError, match="returns dict"):
            run()
    else:
        assert {r["slot"] for r in run() if r["kind"] == "grad_output"} == {"x"}


class Three(nn.Module):
    def __init__(self):
        super().__init__()
        self.s1, self.s2, self.s3 = nn.Sigmoid(), nn.Sigmoid(), nn.Sigmoid()

    def forward(self, x):
        return self.s1(x) + self.s2(x) + self.s3(x)


@scenario(mechanisms=True)
def global_full_backward_every_module(mechanism):
    seen = []

    def hook(m, gi, go):
        if isinstance(m, nn.Sigmoid):  # the root fires too; upstream counts the three Sigmoids
            seen.append(go[0].clone())

    handle = nn.modules.module.register_module_full_backward_hook(hook)
    try:
        Three()(torch.ones(5, 5, requires_grad=True)).backward(torch.ones(5, 5) * 2)
    finally:
        handle.remove()
    assert len(seen) == 3
    rows = hooked_step(Three(), torch.ones(5, 5, requires_grad=True),
                       {"g": {"type": "full_backward", "scope": "global", "layers": "s*", "mechanism": mechanism}},
                       loss=lambda out: (out * 2).sum())
    grad_out = [r for r in rows if r["kind"] == "grad_output"]
    assert sorted(r["layer"] for r in grad_out) == ["s1", "s2", "s3"]
    assert all(r["mean"] == g.double().mean().item() == 2.0 for r, g in zip(grad_out, seen))


@scenario
def global_grad_input_times_two():
    x = torch.randn(5, 5, requires_grad=True)
    hooked_step(nn.Sequential(nn.Sigmoid()), x, {"g": {"type": "scale", "scope": "global", "layers": "0",
                                                       "target": "input", "factor": 2.0}})
    sig = torch.sigmoid(x.detach())
    torch.testing.assert_close(x.grad, sig * (1 - sig) * 2, rtol=0, atol=0)


@scenario
def grad_input_times_two():
    x = torch.randn(5, 5, requires_grad=True)
    hooked_step(nn.Sequential(nn.Sigmoid()), x, {"g": {"type": "scale", "layers": "0", "target": "input",
                                                       "factor": 2.0}})
    y = x.detach().clone().requires_grad_(True)
    reference = nn.Sigmoid()
    reference.register_full_backward_hook(lambda _m, gi, go: tuple(g * 2 for g in gi))
    reference(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)


@scenario
def forward_edits_global():
    x = torch.randn(5, 5, requires_grad=True)
    rows = hooked_step(nn.Sequential(nn.Sigmoid()), x, {
        "pre": {"type": "shift", "scope": "global", "layers": "0", "op": "mul", "value": 3.0},
        "neg": {"type": "edit_output", "scope": "global", "layers": "0", "op": "mul", "value": -1.0}},
        loss=lambda out: (out * 2).sum())
    y = x.detach().clone().requires_grad_(True)
    hs = [nn.modules.module.register_module_forward_pre_hook(lambda m, inp: (inp[0] * 3,)),
          nn.modules.module.register_module_forward_hook(lambda m, inp, out: -out)]
    try:
        (nn.Sigmoid()(y) * 2).sum().backward()
    finally:
        for h in hs:
            h.remove()
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    assert {r["hook"] for r in rows} == {"pre", "neg"}


@scenario
def global_before_local():
    fired = []
    module = nn.Sigmoid()
    hs = [nn.modules.module.register_module_forward_pre_hook(lambda *_: fired.append("g input")),
          module.register_forward_pre_hook(lambda *_: fired.append("l input")),
          nn.modules.module.register_module_forward_hook(lambda *_: fired.append("g output")),
          module.register_forward_hook(lambda *_: fired.append("l output")),
          nn.modules.module.register_module_full_backward_hook(lambda *_: fired.append("g grad_input")),
          module.register_full_backward_hook(lambda *_: fired.append("l grad_input"))]
    try:
        module(torch.randn(5, 5, requires_grad=True)).sum().backward()
    finally:
        for h in hs:
            h.remove()
    kinds = ["input", "output", "grad_input"]
    rows = hooked_step(nn.Sequential(nn.Sigmoid()), torch.randn(5, 5, requires_grad=True), {
        "l": {"type": "stats", "layers": "0", "kinds": kinds},  # listed first, still fires second
        "g": {"type": "stats", "scope": "global", "layers": "0", "kinds": kinds}})
    assert [f"{r['hook']} {r['kind']}" for r in rows] == fired


def full_hook_reference(module, *args):
    seen = {}

    def hook(_m, gi, go):
        seen.update({("grad_input", str(i)): g.clone() for i, g in enumerate(gi) if g is not None})
        seen.update({("grad_output", str(i)): g.clone() for i, g in enumerate(go) if g is not None})

    module.register_full_backward_hook(hook)
    out = module(*args)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    return seen


def assert_rows_match_full_hook(model, reference, args, mechanism="tensor"):
    seen = full_hook_reference(reference, *args)
    rows = hooked_step(model, None, {"c": {"type": "capture", "layers": "", "kinds": ["grad_input", "grad_output"]}},
                       call=lambda m: m(*args), loss=lambda out: (out[0] if isinstance(out, tuple) else out).sum())
    assert {(r["kind"], r["slot"]) for r in rows} == set(seen)
    for r in rows:
        torch.testing.assert_close(r["tensor"], seen[(r["kind"], r["slot"])], rtol=0, atol=0)


@scenario
def batchnorm1d_full_backward():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(5)
    x = torch.randn(5, 5, requires_grad=True)
    assert_rows_match_full_hook(bn, copy.deepcopy(bn), (x,))


@scenario(mechanisms=True)
def pre_hook_result_reaches_full_hook(mechanism):
    rows = hooked_step(nn.Sequential(nn.Sigmoid()), torch.ones(1, 2, requires_grad=True), {
        "half": {"type": "backward_pre", "layers": "0", "replace": 0.5, "mechanism": mechanism},
        "full": {"type": "full_backward", "layers": "0", "mechanism": mechanism}})
    seen = []
    reference = nn.Sigmoid()
    reference.register_full_backward_pre_hook(lambda _m, go: (go[0] * 0.5,))
    reference.register_full_backward_hook(lambda _m, gi, go: seen.append(go[0].clone()))
    reference(torch.ones(1, 2, requires_grad=True)).sum().backward()
    (full_go,) = [r for r in rows if r["hook"] == "full" and r["kind"] == "grad_output"]
    assert full_go["mean"] == seen[0].double().mean().item() == 0.5


class ThreeArgs(nn.Module):
    def forward(self, a, b, c):
        assert a.requires_grad and not b.requires_grad and c.requires_grad
        return a.sum() + b.sum() + c.sum()


@scenario
def input_without_grad():
    inp = torch.rand(2, requires_grad=True)
    rows = hooked_step(ThreeArgs(), None, {"c": {"type": "capture", "layers": "", "kinds": ["grad_input"]}},
                       call=lambda m: m(inp, inp.detach(), inp))
    seen = full_hook_reference(ThreeArgs(), inp, inp.detach(), inp)
    assert sorted(r["slot"] for r in rows) == ["0", "2"]  # PyTorch passes zeros for slot 1
    assert torch.equal(seen[("grad_input", "1")], torch.zeros(2))
    for r in rows:
        assert torch.equal(r["tensor"], seen[("grad_input", r["slot"])])


@scenario(mechanisms=True)
def no_input_requires_grad(mechanism):
    torch.manual_seed(0)
    lin = nn.Linear(2, 3)
    x = torch.rand(1, 2)
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        seen = full_hook_reference(copy.deepcopy(lin), x)
    with contextlib.nullcontext() if mechanism == "tensor" else pytest.warns(UserWarning):
        rows = hooked_step(lin, x, {"f": {"type": "full_backward", "layers": "", "mechanism": mechanism}})
    assert [(r["kind"], r["slot"]) for r in rows] == [("grad_output", "0")] and set(seen) == {("grad_output", "0")}
    assert rows[0]["l2"] == pytest.approx(seen[("grad_output", "0")].double().norm().item())


@scenario
def last_arg_requires_grad():
    inp = torch.rand(1, requires_grad=True)
    rows = hooked_step(nn.L1Loss(), None, {"f": {"type": "full_backward", "layers": ""}},
                       call=lambda m: m(inp.detach(), inp))
    assert {(r["kind"], r["slot"]) for r in rows} == {("grad_input", "1"), ("grad_output", "0")}


class ExtraInput(nn.Module):
    def forward(self, non_tensor, tensor):
        return tensor.clone(), non_tensor


@scenario
def non_tensor_input_and_output():
    inp = torch.rand(2, requires_grad=True)
    assert_rows_match_full_hook(ExtraInput(), ExtraInput(), (True, inp))


class AddsOneInPlace(nn.Module):
    def forward(self, inp):
        inp += 1
        return inp.clone()


@scenario
def inplace_input_fails():
    reference = AddsOneInPlace()
    reference.register_full_backward_hook(lambda *_: None)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        reference(torch.rand(10, requires_grad=True).clone())
    with pytest.raises(ConfigError, match="PyTorch dropped the grad_input hook of ''"):
        hooked_step(AddsOneInPlace(), torch.rand(10, requires_grad=True).clone(),
                    {"f": {"type": "full_backward", "layers": ""}})


@scenario
def inplace_after_output_works():
    """Upstream: ``out += 1`` after the module raises under a full backward hook; the tensor
    mechanism records the gradient of the value the module returned."""
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(10, 10)

        def forward(self, x):
            out = self.inner(x)
            out += 1
            return out * 3

    rows = hooked_step(Wrap(), torch.rand(2, 10, requires_grad=True),  # 2-D: Linear on 1-D returns a view
                       {"f": {"type": "capture", "layers": "inner", "kinds": ["grad_output"]}})
    torch.testing.assert_close(rows[0]["tensor"], torch.full((2, 10), 3.0), rtol=0, atol=0)


class TwoSizes(nn.Module):
    def forward(self, arg1, arg2):
        tmp = arg1.sum() * arg2
        tmp = tmp + arg2.sum() * arg1.sum()
        return tmp.sum().view(1).expand(8).contiguous()


@scenario
def two_inputs_of_different_sizes():
    torch.manual_seed(0)
    args = (torch.randn(5, 5, requires_grad=True), torch.randn(10, 10, requires_grad=True))
    assert_rows_match_full_hook(TwoSizes(), TwoSizes(), args)


@scenario
def output_grad_times_two():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    reference = copy.deepcopy(model)
    def double(_m, _i, out):
        out.register_hook(lambda g: g * 2)

    reference[0].register_forward_hook(double)
    x = torch.randn(2, 3)
    reference(x).sum().backward()
    hooked_step(model, x, {"d": {"type": "scale", "layers": "0", "target": "output", "factor": 2.0}})
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


@scenario
def hook_before_inplace_stays_bound():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    seen = []
    reference = copy.deepcopy(model)
    def keep(_m, _i, out):
        out.register_hook(lambda g: seen.append(g.clone()))

    reference[0].register_forward_hook(keep)
    x = torch.randn(4, 3)
    reference(x).sum().backward()
    rows = hooked_step(model, x, {"c": {"type": "capture", "layers": "0", "kinds": ["grad_output"]}})
    torch.testing.assert_close(rows[0]["tensor"], seen[0], rtol=0, atol=0)


class View(nn.Module):
    def forward(self, x):
        return x.view(x.shape)


@scenario
def hook_on_view_modified_in_place_fails():
    model = nn.Sequential(nn.Linear(3, 3), View(), nn.ReLU(inplace=True), nn.Linear(3, 1))
    with pytest.raises(ConfigError, match="PyTorch dropped the grad_output hook of '1'"):
        hooked_step(model, torch.randn(2, 3), {"c": {"type": "stats", "layers": "1", "kinds": ["grad_output"]}})


@scenario
def tensor_hook_then_post_accumulate():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    reference = copy.deepcopy(model)
    order = []
    reference.bias.register_hook(lambda g: order.append(("tensor", g.clone())) or g * 2)
    reference.bias.register_post_accumulate_grad_hook(lambda p: order.append(("post", p.grad.clone())))
    x = torch.randn(4, 3)
    reference(x).sum().backward()
    rows = hooked_step(model, x, {"post": {"type": "post_accumulate", "layers": "", "params": ["bias"]},
                                  "x2": {"type": "scale", "layers": "", "params": ["bias"], "factor": 2.0}})
    backward = [r for r in rows if r["phase"] == "backward"]
    assert [r["hook"] for r in backward] == ["x2", "post"] and [o[0] for o in order] == ["tensor", "post"]
    assert backward[1]["mean"] == order[1][1].double().mean().item() == 2 * order[0][1].double().mean().item()


@scenario
def node_hooks_after_tensor_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    reference = copy.deepcopy(model)
    seen = {}

    def on_forward(_m, _i, out):
        out.register_hook(lambda g: g * 2)
        out.grad_fn.register_prehook(lambda go: seen.__setitem__("grad_output", go[0].clone()))
        out.grad_fn.register_hook(lambda gi, go: seen.__setitem__("grad_input", gi))

    reference[0].register_forward_hook(on_forward)
    x = torch.randn(2, 3)
    reference(x).sum().backward()
    rows = hooked_step(model, x, {"node": {"type": "node", "layers": "0"},  # listed first, fires after the tensor hook
                                  "x2": {"type": "scale", "layers": "0", "target": "output", "factor": 2.0}})
    (pre,) = [r for r in rows if r["hook"] == "node" and r["kind"] == "grad_output"]
    assert pre["mean"] == pytest.approx(seen["grad_output"].double().mean().item(), rel=1e-6)
    post = {r["slot"]: r for r in rows if r["hook"] == "node" and r["kind"] == "grad_input"}
    expected = {f"0.{i}": g for i, g in enumerate(seen["grad_input"]) if g is not None}
    assert set(post) == set(expected)
    for slot, g in expected.items():
        assert post[slot]["l2"] == pytest.approx(g.double().norm().item(), rel=1e-6)


@scenario
def saved_tensors_identity_pack():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    reference = copy.deepcopy(model)
    packed = []
    x = torch.randn(2, 3)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        out = reference(x)
    out.sum().backward()
    rows = hooked_step(model, x, {"s": {"type": "saved_tensors", "layers": "", "mode": "offload_cpu"}})
    assert [r["tensor_shape"] for r in rows] == [list(s) for s in packed] and len(packed) > 3
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)


class Fails(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


@scenario
def always_call_sees_no_output():
    outputs = []
    reference = Fails()
    reference.register_forward_hook(lambda _m, _i, out: outputs.append(out), always_call=True)
    with pytest.raises(ValueError):
        reference(torch.ones(1))
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(ValueError):
        hooked_step(nn.Sequential(Fails()), torch.ones(1),
                    {"p": {"type": "print", "layers": "0", "always_call": True}})
    assert outputs == [None] and text.getvalue() == "0: no output (forward raised)\n"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_upstream_scenario(name):
    """Every scenario above, registered by ``@scenario`` (this test comes last so all are known)."""
    fn, mechanism = SCENARIOS[name]
    fn(mechanism) if mechanism else fn()
