"""The hot path, counted rather than timed (a shared machine's clock is noise): Python calls into this
repository and aten ops per training step. Each budget is what the code reaches, so work put back on
the path (one more call per recorded tensor, a hook per parameter for nothing) fails here.
"""
from __future__ import annotations

import collections
import sys

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import runner
from hooks import HookSession, build_hooks
from hooks.kernels import native
from project_code import project_file

pytestmark = pytest.mark.statistics

#: Calls into the repository per recorded tensor of ``stats`` (output or output gradient), beyond
#: the step's fixed calls (10 measured on 2026-11-28; 23 before, on 2026-11-27; 31 before the
#: recorder's per-tensor checks were taken off, 25 on 2026-11-25). Per leaf module (two rows): the
#: tap's forward hook (``Tap._forward``, a partial: no wrapper), ``Recorder.next_call``,
#: ``Junction.expect``, the junction's forward hook and ``_tap``, ``Tap._grad_hook`` (the record-only
#: callback is a partial of ``Recorder.record``), the junction's tensor hook, the session's
#: post-accumulate-grad ``landed`` (per parameter, one here per leaf); per row: ``Recorder.record``,
#: ``_append``, ``_reduce``, ``hooks.kernels.stats.reduce_real``, ``native.readable``, ``native.reduce_contiguous``.
STATS_CALLS_PER_ROW = 10
#: aten ops per recorded tensor (the kernel's output buffer, the flat view, a detach; an alias is free).
STATS_OPS_PER_ROW = 3
#: Calls into the repository per parameter of a ``clamp`` with ``record: false``: the shared
#: parameter hook (``ParamLineup._on_grad``), the entry's callback, the call count (``next_call``),
#: ``apply_edit`` and ``tensor_kinds.edited`` (the clamp itself is a partial of ``torch.clamp``): 5
#: measured on 2026-11-28, 12 before (the lineup chained its members per gradient, the kind checks
#: and the shape check were calls, ``Clamp.transform`` a method).
QUIET_CLAMP_CALLS_PER_PARAM = 5

STATS = {"stats": {"type": "stats", "layers": "leaf:**"}}
QUIET_CLIP = {"clip": {"type": "clamp", "layers": "**", "min": -0.01, "max": 0.01, "record": False}}


def net(depth: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(4 * 8 * 8, 2))


X = torch.randn(2, 3, 8, 8)


def repo_calls(fn) -> int:
    """Python function calls into the project's packages while ``fn`` runs (not torch's, wherever the venv is)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and project_file(frame.f_code.co_filename):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


class AtenOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def train_step(model: nn.Module) -> None:
    model.zero_grad(set_to_none=True)
    model(X).sum().backward()


def session_step(entries: dict, depth: int):
    """``(repo calls, aten ops, rows)`` of one warmed-up step of ``entries`` on ``net(depth)``, driven
    as the benchmark drives the runner (``after_backward``, ``drain``)."""
    model = net(depth)
    rows = []

    def step():
        train_step(model)
        session.after_backward()
        rows.append(len(session.recorder.drain()))

    with HookSession(model, build_hooks(entries)) as session:
        step()
        step()
        calls = repo_calls(step)
        with AtenOps() as ops:
            step()
    return calls, ops.ops, rows[-1]


def per_unit(small: tuple[int, int], large: tuple[int, int]) -> float:
    """Calls (or ops) per unit (row, parameter) between two sizes of the same model: the fixed cost cancels."""
    return (large[0] - small[0]) / (large[1] - small[1])


@pytest.fixture
def kernel():
    if native.kernel() is None:
        pytest.skip("no C compiler: the eager reductions make other calls")


def test_a_session_without_entries_adds_no_call_per_module_or_parameter():
    small, _, _ = session_step({}, 1)
    large, _, _ = session_step({}, 4)
    assert small == large, "a session without entries calls the repository per module or parameter"


def test_a_users_loop_without_entries_costs_the_same_calls_whatever_the_model_size(tmp_path):
    """``runner.attach`` with no entries: the step's bookkeeping (the steps table, lifetimes) only."""
    counts = []
    for depth in (1, 4):
        model = net(depth)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        with runner.attach(model, out_dir=tmp_path / f"run{depth}") as run:
            def step():
                optimizer.zero_grad(set_to_none=True)
                loss = model(X).sum()
                loss.backward()
                optimizer.step()
                run.step(loss)
            step()
            step()
            counts.append(repo_calls(step))
    assert counts[0] == counts[1], f"per-step calls grow with the model: {counts}"


def test_stats_calls_per_recorded_tensor_stay_within_the_budget(kernel):
    small_calls, _, small_rows = session_step(STATS, 1)
    large_calls, _, large_rows = session_step(STATS, 4)
    assert (small_rows, large_rows) == (12, 24)  # output and output gradient of each leaf
    per_row = per_unit((small_calls, small_rows), (large_calls, large_rows))
    assert per_row <= STATS_CALLS_PER_ROW, f"{per_row} calls per recorded tensor"
    fixed = small_calls - per_row * small_rows
    assert fixed <= 30, f"{fixed} calls a step beyond the recorded tensors"


def test_stats_aten_ops_per_recorded_tensor_stay_within_the_budget(kernel):
    extra = []
    for depth in (1, 4):
        _, bare, _ = session_step({}, depth)
        _, ops, rows = session_step(STATS, depth)
        extra.append((sum(ops.values()) - sum(bare.values()), rows))
    per_row = per_unit(*extra)
    assert per_row <= STATS_OPS_PER_ROW, f"{per_row} aten ops per recorded tensor"
    fixed = extra[0][0] - per_row * extra[0][1]
    assert fixed <= 3, f"{fixed} aten ops a step beyond the recorded tensors (the one stack of the step's results)"


def test_a_clamp_that_records_nothing_costs_the_ops_of_the_clamp_by_hand():
    """Same aten ops as ``p.register_hook(lambda g: g.clamp(...))`` on every parameter, the same
    gradients, no rows, and a bounded number of calls per parameter (no hook per parameter beyond
    the clamp's own: nothing marks that gradients landed when nothing is recorded after backward)."""
    by_hand = net(4)
    for p in by_hand.parameters():
        p.register_hook(lambda g: g.clamp(-0.01, 0.01))
    train_step(by_hand)
    with AtenOps() as hand_ops:
        train_step(by_hand)

    quiet_calls, quiet_ops, rows = session_step(QUIET_CLIP, 4)
    assert quiet_ops == hand_ops.ops
    assert rows == 0

    model = net(4)
    with HookSession(model, build_hooks(QUIET_CLIP)) as session:
        train_step(model)
        session.after_backward()
    for p, q in zip(model.parameters(), by_hand.parameters()):
        assert torch.equal(p.grad, q.grad)

    small_calls, _, _ = session_step(QUIET_CLIP, 1)
    params = lambda depth: len(list(net(depth).parameters()))  # noqa: E731
    per_param = per_unit((small_calls, params(1)), (quiet_calls, params(4)))
    assert per_param <= QUIET_CLAMP_CALLS_PER_PARAM, f"{per_param} calls per parameter"


def test_the_recording_clamp_records_what_the_quiet_one_does_not(kernel):
    """The default ``clip`` still records each gradient, what the clamp removed and the landed gradient."""
    entries = {"clip": {**QUIET_CLIP["clip"], "record": True}}
    _, ops, rows = session_step(entries, 1)
    params = len(list(net(1).parameters()))
    assert rows == 3 * params  # param_grad, clipped, after_backward
    assert ops["aten.sub.Tensor"] == params


def landed_calls(entries: dict) -> tuple[int, int]:
    """``(calls of the session's landed-gradient marking in one step, parameters)`` for ``entries`` on ``net(2)``."""
    model, calls = net(2), 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_name == "landed" and project_file(frame.f_code.co_filename):
            calls += 1

    with HookSession(model, build_hooks(entries)) as session:
        sys.setprofile(profile)
        try:
            train_step(model)
        finally:
            sys.setprofile(None)
        session.after_backward()
        session.recorder.drain()
    return calls, len(list(model.parameters()))


def test_forward_only_entries_add_no_call_per_parameter_and_backward_entries_mark_every_gradient():
    """The post-accumulate-grad marking is there only while an entry acts after backward."""
    forward, _ = landed_calls({"s": {"type": "stats", "layers": "leaf:**", "kinds": ["output"]}})
    backward, parameters = landed_calls({"s": {"type": "stats", "layers": "leaf:**", "kinds": ["grad_output"]}})
    assert forward == 0
    assert backward == parameters
