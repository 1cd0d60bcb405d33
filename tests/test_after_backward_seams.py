"""``after_backward`` rows in a loop that drops the gradients before ``run.step()`` (``model.zero_grad()``
with no optimizer): each step's rows are the gradients that landed, once per step, as plain PyTorch
computes them (the clip entry's clamp applied), also when two backward passes accumulate first."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import runner
import runner.analysis as analysis
from hooks.mechanism.session import LostRowsWarning

pytestmark = pytest.mark.statistics

MAX = 0.001  #: the clip entry's upper bound (its lower: the preset's -0.01)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))  # 4 parameters


def batches(steps: int, backwards: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(1)
    return [[(torch.randn(5, 3, generator=gen), torch.randint(0, 2, (5,), generator=gen)) for _ in range(backwards)]
            for _ in range(steps)]


def by_hand(data) -> list[dict[str, torch.Tensor]]:
    """Per step, each parameter's accumulated gradient with the clamp applied to each backward's, in plain
    PyTorch (no runner): what the clip entry leaves in ``.grad``."""
    model = mlp()
    handles = [p.register_hook(lambda g: g.clamp(-0.01, MAX)) for p in model.parameters()]
    out = []
    for step in data:
        for x, y in step:
            F.cross_entropy(model(x), y).backward()
        out.append({name: p.grad.double().clone() for name, p in model.named_parameters()})
        model.zero_grad()
    for handle in handles:
        handle.remove()
    return out


@pytest.mark.parametrize("backwards", [1, 2])
def test_gradients_dropped_before_the_step_ends_are_recorded_as_they_landed(tmp_path, backwards):
    data = batches(2, backwards)
    model = mlp()
    with runner.attach(model, hooks=["clip"], overrides=[f"hooks.clip.max={MAX}"], out_dir=tmp_path / "run") as run:
        for step in data:
            for x, y in step:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            model.zero_grad()  # no optimizer: the gradients are gone when the step ends
            run.step(loss)
    rows = analysis.load_stats(tmp_path / "run")
    rows = rows[rows.phase == "after_backward"]
    hand = by_hand(data)
    assert len(rows) == 8  # 2 steps x 4 parameters, each once
    assert sorted((r.step, f"{r.layer}.{r.slot}") for r in rows.itertuples()) == sorted(
        (step, name) for step in range(2) for name in hand[step])
    for row in rows.itertuples():
        grad = hand[row.step][f"{row.layer}.{row.slot}"]
        assert row.l2 == pytest.approx(float(grad.norm()), rel=1e-6)
        assert row.mean == pytest.approx(float(grad.mean()), rel=1e-6, abs=1e-12)
        assert row.max == pytest.approx(float(grad.max()), rel=1e-6, abs=1e-12)


def test_gradients_freed_inside_backward_are_said_lost_in_one_line(tmp_path):
    """An optimizer in backward (``post_accumulate`` with ``op: sgd``) frees each ``.grad`` before backward
    ends: the clip entry's after_backward rows cannot be recorded, and a warning names the entry and them."""
    model = mlp()
    hooks = {"sgd": {"type": "post_accumulate", "layers": "**", "op": "sgd", "lr": 0.1},
             "clip": {"type": "clamp", "layers": "**", "max": MAX}}
    with pytest.warns(LostRowsWarning) as said, runner.attach(model, hooks=hooks, out_dir=tmp_path / "run") as run:
        for (x, y), in batches(1, 1):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            run.step(loss)
    assert [str(w.message) for w in said if w.category is LostRowsWarning] == [
        "hooks.clip recorded no after_backward row of 0.weight, 0.bias, 2.weight, 2.bias: its .grad was freed inside "
        "backward (an optimizer in backward, e.g. post_accumulate with op=sgd)"]
    rows = analysis.load_stats(tmp_path / "run")
    assert "after_backward" not in set(rows.phase) and len(rows[rows.hook == "clip"]) == 8  # backward: 4 param_grad, 4 clipped
