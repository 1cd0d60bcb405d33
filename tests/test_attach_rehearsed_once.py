"""A loop of ``runner.attach`` blocks with a kept plan on the same model rehearses its first call once
(``runner.engine.rehearsal``: ``model_state``), and rehearses again whatever could change the pass: another
model, a module changed, a hook or a flag of the user's, other input shapes, other arguments; a refused
rehearsal is refused again."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

import runner
from common.errors import ConfigError
from runner.engine import attach_plan as attach_plan_module, rehearsal as rehearsal_module


@pytest.fixture
def rehearsed(monkeypatch) -> list:
    """The module names of each first-call meta pass made from now on, from no kept plan or rehearsal."""
    monkeypatch.setattr(attach_plan_module, "_COMPILED", {})
    monkeypatch.setattr(rehearsal_module, "_REHEARSED", {})
    seen, real = [], rehearsal_module.rehearse_call
    monkeypatch.setattr(rehearsal_module, "rehearse_call",
                        lambda module, name, *args: seen.append(name) or real(module, name, *args))
    return seen


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _block(model, out, x=None, hooks=("clip", "stats"), **kwargs):
    """One attach block of one step; what its first call's rehearsal showed."""
    x = torch.arange(12.0).view(3, 4).sin() if x is None else x
    with runner.attach(model, hooks=list(hooks), out_dir=out, **kwargs) as run:
        loss = model(x).pow(2).sum()
        loss.backward()
        run.step(loss)
    model.zero_grad()
    return run.rehearsal


def test_blocks_of_a_kept_plan_on_the_same_model_rehearse_once_and_show_the_same(rehearsed, tmp_path):
    model = _model()
    shown = [_block(model, tmp_path / str(n)) for n in range(4)]
    assert len(rehearsed) == 1  # the first block's: its plan is kept from there on
    assert all(vars(later) == vars(shown[0]) for later in shown[1:])
    assert shown[0].records and shown[0].modules and shown[0].input_shape == [[3, 4]]
    stats = [pd.read_parquet(tmp_path / str(n) / "stats.parquet").drop(columns="wall_time_s", errors="ignore")
             for n in (0, 3)]  # rehearsed, and not
    assert len(stats[0]) > 0
    pd.testing.assert_frame_equal(stats[0], stats[1])


@pytest.mark.parametrize("change", ["another model", "a layer replaced", "a flag", "a hook of the user's",
                                    "other input shapes", "other arguments", "no gradients", "eval mode"])
def test_what_could_change_the_pass_is_rehearsed_again(rehearsed, tmp_path, change):
    model = _model()
    _block(model, tmp_path / "a")
    _block(model, tmp_path / "b")
    before = len(rehearsed)
    kwargs, x = {}, None
    if change == "another model":
        model = _model()
    elif change == "a layer replaced":
        model[2] = nn.Linear(8, 5)
    elif change == "a flag":
        model[1].inplace = True
    elif change == "a hook of the user's":
        model[0].register_forward_hook(lambda module, args, out: None)
    elif change == "other input shapes":
        x = torch.randn(5, 4)
    elif change == "other arguments":
        kwargs = {"overrides": ["hooks.clip.max=0.2"]}
    elif change == "eval mode":
        model.eval()
    if change == "no gradients":
        with torch.no_grad():
            with runner.attach(model, hooks=["clip", "stats"], out_dir=tmp_path / "c") as run:
                model(torch.randn(3, 4))
                run.step()
    else:
        _block(model, tmp_path / "c", x, **kwargs)
    assert len(rehearsed) == before + 1, change


def test_a_refused_first_call_is_refused_again(rehearsed, tmp_path):
    model = _model()
    for n in range(3):
        with pytest.raises(ConfigError, match="memory.budget"):
            _block(model, tmp_path / str(n), hooks=["extract"], overrides=["hooks.extract.layers=[0]"],
                   memory={"budget": "1B"})
        assert not (tmp_path / str(n) / "manifest.json").exists()
    assert len(rehearsed) == 3
