"""Every registered hook type has a preset and runs from it on resnet18 (faults: test_isolation.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import hook_count, make_config
from hooks import HOOK_TYPES
from models_for_tests import TrackedResNet18
from runner.run import run

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "hooks").glob("*.yaml"))
HOOK_PRESETS = [p for p in PRESETS if p != "none"]


def test_every_hook_type_has_a_preset():
    used = {make_config(f"hooks={p}", "model=resnet18").hooks[p].type for p in HOOK_PRESETS}
    assert used == set(HOOK_TYPES)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_and_removes_its_hooks(tmp_path, preset):
    TrackedResNet18.instances.clear()
    cfg = make_config(f"hooks={preset}", "model=resnet18", "+model._target_=models_for_tests.TrackedResNet18",
                      "data.shape=[2,3,32,32]")
    out = run(cfg, tmp_path / "out")
    assert (out / "manifest.json").is_file()
    (model,) = TrackedResNet18.instances
    assert hook_count(model) == 0
