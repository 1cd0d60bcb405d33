"""One gate: every check a config passes runs once per run, from the command line or ``runner.attach``.

Each function the gate lists (``runner.engine.plan.GATE``) is wrapped with a counter wherever a
module of the project holds it, so a builder that checked again (``build_model`` calling
``check_target``, ``DataSource`` checking the kind) would be counted too.
"""
from __future__ import annotations

import inspect
import re
import sys
from collections import Counter

import pytest
import torch
from torch import nn

from common.errors import ConfigError

import runner
from runner.cli import replay
from runner.cli.commandline import check_command_line
from runner.cli.execute import execute
from runner.config.compose import compose_config
from runner.engine import plan as plan_module
from runner.store import claim

#: Checks a run of this config does not reach: ``check_hf`` is for ``model=hf`` only.
NOT_REACHED = {"check_hf"}
#: What ``runner.attach`` checks of its config (it builds no model, data, loss or optimizer of its own).
ATTACH_CHECKS = {"_typed", "_import_modules", "_steps_or_epochs", "_check_settings", "check_metric",
                 "_check_repeated_presets", "build_hooks", "check_budget"}


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Calls of each gate check (and of the output directory's check) while the test runs."""
    wanted = {name: getattr(plan_module, name) for name in plan_module.GATE}
    wanted["check_output_dir"] = claim.check_output_dir
    calls: Counter = Counter()

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for module in [m for name, m in sys.modules.items() if name.split(".")[0] in ("runner", "hooks") and m]:
        for attr, value in list(vars(module).items()):
            for name, fn in wanted.items():
                if value is fn:
                    monkeypatch.setattr(module, attr, counting(name, fn))
    return calls


def test_the_gate_lists_every_check_of_the_plan():
    checks = {name for name, fn in vars(plan_module).items()
              if inspect.isfunction(fn) and re.match(r"_?check_", name)}
    assert checks <= set(plan_module.GATE)
    assert all(callable(getattr(plan_module, name)) for name in plan_module.GATE)


def test_each_check_runs_once_for_one_command_line_run(counts, tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(nn.Linear(3, 3).state_dict(), weights)
    argv = ["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=3", "+model.out_features=3",
            "model.input_shape=[2,3]", f"model.checkpoint={weights}", "hooks=[clip,stats]", "optimizer=sgd",
            "steps=2", "eval_every=1"]
    checked = check_command_line(argv)  # what ``python -m runner ARGV`` does, in this process
    assert checked.problems == []
    cfg = compose_config(argv)
    execute(cfg, tmp_path / "run", argv, plan=checked.plan_for(cfg))
    assert (tmp_path / "run" / "manifest.json").is_file()
    expected = {name: 1 for name in [*plan_module.GATE, "check_output_dir"] if name not in NOT_REACHED}
    assert dict(counts) == expected


def test_each_check_runs_at_most_once_for_one_attach_run(counts, tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with runner.attach(model, hooks=["clip", "stats"], out_dir=tmp_path / "run") as run:
        for _ in range(2):
            loss = model(torch.randn(5, 3)).sum()
            run.backward(loss)
            run.step(loss)
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert set(counts.values()) == {1}
    assert ATTACH_CHECKS <= set(counts)


def test_a_missing_checkpoint_file_is_refused_by_the_gate_also_without_a_rehearsal(tmp_path):
    missing = tmp_path / "nowhere.pt"
    checked = check_command_line(["model=resnet18", "model.weights=DEFAULT", f"model.checkpoint={missing}"])
    assert checked.problems == [f"model.checkpoint: no file at '{missing}'"]


KEPT = r"\(it kept steps \[0\]\); set hooks.patch.source_step or run fewer steps$"


def test_a_patch_source_step_is_checked_also_when_the_model_is_not_rehearsed(run_with, monkeypatch):
    source = run_with("model=mlp", "data.shape=[2,100]", "hooks=extract", "hooks.extract.layers=fc1", "loss=none")
    monkeypatch.setattr(plan_module, "rehearse", lambda *args: None)  # as for a model the meta device cannot run
    patch = ["model=mlp", "data.shape=[2,100]", "loss=none", "hooks=patch", f"hooks.patch.source={source}",
             "hooks.patch.layers=fc1"]
    with pytest.raises(ConfigError, match=rf"^hooks.patch.source_step: run '.*' has no step 3 {KEPT}"):
        plan_module.compile_plan(compose_config([*patch, "hooks.patch.source_step=3"]))
    with pytest.raises(ConfigError, match=rf"^hooks.patch.source_step: run '.*' has no step 1 {KEPT}"):
        plan_module.compile_plan(compose_config([*patch, "steps=2"]))
    assert plan_module.compile_plan(compose_config(patch)).rehearsal is None


def test_each_check_runs_once_for_one_replay(counts, run_with, tmp_path):
    stored = run_with("model=mlp", "data.shape=[2,100]", "hooks=clip", "steps=2")
    counts.clear()  # the stored run's own compile is not the replay's
    assert replay.main([f"replay={stored}", f"replay.out={tmp_path / 'again'}"]) == 0
    expected = {name: 1 for name in [*plan_module.GATE, "check_output_dir"] if name not in {"check_hf", "check_target"}}
    assert dict(counts) == expected
