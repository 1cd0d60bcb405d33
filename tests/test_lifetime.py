"""Entry lifetimes (``steps: [from, to]``, ``max_calls``): the PyTorch handles really go, on time."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import hook_count, hook_snapshot, stats_of
from hooks import ConfigError, HookSession, build_hooks
from runner.sources.models import MLP

ORDER: list[str] = []


def first(module, args, output):
    ORDER.append("first")


def second(module, args, output):
    ORDER.append("second")


def drive(model: nn.Module, entries: dict, steps: int, during=None):
    """The run loop's use of a session: begin_step, forward, backward; rows as (step, hook, kind)."""
    rows = []
    x = torch.randn(2, 100)
    with HookSession(model, build_hooks(entries)) as session:
        for step in range(steps):
            session.begin_step(step)
            session.backward(model(x).sum())
            captures = session.recorder.drain()
            rows += [(step, h, k) for h, k in zip(captures.columns["hook"], captures.columns["kind"])]
            if during:
                during(step, session)
        lifetimes = session.lifetimes()
    return rows, lifetimes


def test_steps_attach_at_from_and_remove_at_to():
    model = MLP()
    snapshots = {}
    rows, lifetimes = drive(model, {
        "late": {"type": "stats", "layers": "fc1", "kinds": ["output"], "steps": [1, 3]},
        "always": {"type": "stats", "layers": "fc2", "kinds": ["output"]},
    }, steps=5, during=lambda step, s: snapshots.__setitem__(step, hook_snapshot(model)))
    assert sorted({s for s, h, _ in rows if h == "late"}) == [1, 2]  # to=3 is excluded
    assert sorted({s for s, h, _ in rows if h == "always"}) == [0, 1, 2, 3, 4]
    assert lifetimes["hooks.late"] == {"attached_at_step": 1, "removed_at_step": 3, "calls": 2}
    assert lifetimes["hooks.always"]["removed_at_step"] is None
    # fc1's hook dicts are empty before step 1 and from step 3 on, while fc2 keeps its hook
    for step, snap in snapshots.items():
        fc1 = snap["module 'fc1'._forward_hooks"]
        assert bool(fc1) == (step in (1, 2)), step
        assert snap["module 'fc2'._forward_hooks"]
    assert hook_count(model) == 0


def test_max_calls_removes_tap_and_parameter_hooks_after_the_pass():
    model = MLP()
    after = {}
    rows, lifetimes = drive(model, {
        "watch": {"type": "stats", "layers": "fc1", "kinds": ["output", "grad_output"], "max_calls": 2},
        "clip": {"type": "clamp", "layers": "fc2", "min": -0.5, "max": 0.5, "max_calls": 2},  # 2 params: 1 step
    }, steps=4, during=lambda step, s: after.__setitem__(step, hook_snapshot(model)))
    assert sorted({s for s, h, _ in rows if h == "watch"}) == [0, 1]
    assert {s for s, h, k in rows if h == "clip" and k == "param_grad"} == {0}
    assert lifetimes["hooks.watch"] == {"attached_at_step": 0, "removed_at_step": 1, "calls": 2}
    assert lifetimes["hooks.clip"] == {"attached_at_step": 0, "removed_at_step": 0, "calls": 2}
    assert not after[0]["parameter 'fc2.weight'._backward_hooks"]
    assert not after[0]["parameter 'fc2.bias'._backward_hooks"]
    assert after[0]["module 'fc1'._forward_hooks"] and not after[1]["module 'fc1'._forward_hooks"]


def test_an_entry_attached_later_still_fires_in_config_order():
    ORDER.clear()
    model = MLP()
    drive(model, {
        "a": {"type": "custom", "fn": "test_lifetime.first", "layers": "fc1", "steps": [1, None]},
        "b": {"type": "custom", "fn": "test_lifetime.second", "layers": "fc1"},
    }, steps=2)
    assert ORDER == ["second", "first", "second"]


def test_saved_tensors_on_disk_outlive_the_forward_that_made_the_last_call(tmp_path):
    model = MLP()
    rows, lifetimes = drive(model, {"off": {"type": "saved_tensors", "layers": "fc2", "mode": "offload_disk",
                                            "directory": str(tmp_path), "max_calls": 1}}, steps=2)
    assert {s for s, h, _ in rows if h == "off"} == {0}  # backward of step 0 read its files back
    assert lifetimes["hooks.off"]["removed_at_step"] == 0 and not any(tmp_path.iterdir())


def test_max_calls_through_the_runner(run_with):
    run_dir = run_with("model=mlp", "steps=3", "+hooks.s={type:stats,layers:fc1,kinds:[output],max_calls:1}")
    assert list(stats_of(run_dir, hook="s").step) == [0]


@pytest.mark.parametrize("keys, message", [
    ({"steps": [3, 1]}, "hooks.h.steps: [3, 1] is not [from, to] with 0 <= from < to"),
    ({"steps": [1]}, "hooks.h.steps: [1] is not"),
    ({"steps": [-1, 2]}, "hooks.h.steps: [-1, 2] is not"),
    ({"max_calls": 0}, "hooks.h.max_calls: 0 must be at least 1"),
])
def test_bad_lifetimes_are_refused(keys, message):
    with pytest.raises(ConfigError, match=rf"^{message}".replace("[", r"\[").replace("]", r"\]")):
        build_hooks({"h": {"type": "stats", "layers": "fc1", **keys}})
