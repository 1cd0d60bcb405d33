"""A loop of ``runner.attach`` blocks compiles its arguments once (``runner.engine.attach_plan``), and a kept
plan is never used where compiling again would say or do anything else."""
from __future__ import annotations

import shutil
import sys
import types

import pandas as pd
import pytest
import torch
import yaml
from torch import nn

import runner
from common.errors import ConfigError
from conftest import assert_no_partial_output
from runner.engine import attach_plan as attach_plan_module, plan as plan_module


@pytest.fixture
def compiles(monkeypatch) -> list:
    """The settings compiled (``plan._typed``: the schema merge every compile starts with), from no kept plan."""
    monkeypatch.setattr(attach_plan_module, "_COMPILED", {})
    seen, typed = [], plan_module._typed
    monkeypatch.setattr(plan_module, "_typed", lambda cfg: seen.append(cfg) or typed(cfg))
    return seen


def _block(out, hooks=("clip", "stats"), **kwargs):
    """One attach block of one step on a fixed model and batch; its directory."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with runner.attach(model, hooks=list(hooks) if not isinstance(hooks, dict) else hooks, out_dir=out,
                       **kwargs) as run:
        loss = model(x).pow(2).sum() * 100
        loss.backward()
        run.step(loss)
    return out


def _config(out) -> dict:
    return yaml.safe_load((out / "config.yaml").read_text())


def test_a_second_block_of_the_same_arguments_compiles_nothing_and_writes_the_same_tables(compiles, tmp_path):
    first = _block(tmp_path / "first")
    second = _block(tmp_path / "second")
    assert len(compiles) == 1
    assert (first / "config.yaml").read_text() == (second / "config.yaml").read_text()
    for name in ("stats.parquet", "steps.parquet"):
        mine, kept = pd.read_parquet(first / name), pd.read_parquet(second / name)
        timings = [c for c in ("wall_time_s", "peak_memory_bytes") if c in mine]
        pd.testing.assert_frame_equal(mine.drop(columns=timings), kept.drop(columns=timings))
    assert len(pd.read_parquet(second / "stats.parquet")) > 0


def test_other_arguments_are_compiled_again(compiles, tmp_path):
    outs = [_block(tmp_path / "a", overrides=["hooks.clip.max=0.1"]),
            _block(tmp_path / "b", overrides=["hooks.clip.max=0.2"]),
            _block(tmp_path / "c", overrides=["hooks.clip.max=0.2"], seed=3),
            _block(tmp_path / "d", overrides=["hooks.clip.max=0.2"], seed=3, sample={"every": 2})]
    assert len(compiles) == 4
    assert [_config(out)["hooks"]["clip"]["max"] for out in outs] == [0.1, 0.2, 0.2, 0.2]
    assert [_config(out)["seed"] for out in outs] == [0, 0, 3, 3]
    assert [_config(out)["sample"]["every"] for out in outs] == [1, 1, 1, 2]


def test_the_kernels_switch_is_checked_by_a_block_whose_arguments_were_compiled(compiles, tmp_path, monkeypatch):
    _block(tmp_path / "ok")
    monkeypatch.setenv("HOOK_RUNNER_NATIVE", "yes")
    with pytest.raises(ConfigError, match=r"^HOOK_RUNNER_NATIVE='yes': valid: 1 .* or 0 "):
        _block(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_a_run_changing_its_settings_leaves_the_kept_plan_alone(compiles):
    plan = attach_plan_module.attach_plan(["stats"], [], {}, [])
    plan.settings.sample.every = 7
    again = attach_plan_module.attach_plan(["stats"], [], {}, [])
    assert len(compiles) == 1 and again.settings.sample.every == 1


def test_a_removed_stored_run_is_refused_by_the_next_block_before_it_writes(compiles, tmp_path):
    source = _block(tmp_path / "source", hooks=("extract",), overrides=["hooks.extract.layers=['0']"])
    patch = {"p": {"type": "patch", "layers": "0", "source": str(source)}}
    _block(tmp_path / "patched", hooks=patch)
    shutil.rmtree(source)
    with pytest.raises(ConfigError, match=r"^hooks.p.source: "):
        _block(tmp_path / "refused", hooks=patch)
    assert len(compiles) == 3  # refused by the gate's check of the entry, not by the run reading the files
    assert_no_partial_output(tmp_path / "refused")


def test_a_users_function_redefined_between_two_blocks_is_checked_again(compiles, tmp_path, monkeypatch):
    module = types.ModuleType("attach_plan_user_hooks")
    module.scale = lambda module_, args, output: output * 2
    monkeypatch.setitem(sys.modules, module.__name__, module)
    custom = {"h": {"type": "custom", "layers": "0", "fn": f"{module.__name__}.scale"}}
    _block(tmp_path / "first", hooks=custom)
    module.scale = lambda output: output  # a notebook cell run again, with one argument where PyTorch passes three
    with pytest.raises(ConfigError, match=r"^hooks.h.fn: "):
        _block(tmp_path / "refused", hooks=custom)
    assert len(compiles) == 2
    assert_no_partial_output(tmp_path / "refused")
