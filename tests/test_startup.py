"""The command line is checked before torch is imported: the static index of registered names
(``runner.config.index``) equals the registries, its schemas compose as the real ones, a mistake in a
choice is the gate's own line, and ``python -m runner`` answers one without importing torch or a hook module."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
from runner.cli.early import compose_command_line
from runner.config.compose import compose_config
from runner.config.index import REGISTRIES, live_index, schemas
from runner.config.registered import INDEX
from runner.engine.plan import compile_plan

ROOT = Path(__file__).resolve().parents[1]

#: One mistake in each kind of choice, each of which only the gate (with torch) caught before.
CHOICE_MISTAKES = [
    ["hooks=clip", "hooks.clip.type=clmap"],
    ["model=convnet", "model.name=resnet19"],
    ["data.kind=randm"],
    ["loss.name=sums"],
    ["optimizer.name=sdg"],
    ["+logger.foo={}"],
    ["plots=[gradflow]"],
    ["metric.measures=[logitt]"],
]


def test_the_index_equals_the_registries():
    """Regenerate it with ``python -m runner.config.index`` when a choice or a schema changes."""
    assert live_index() == INDEX


def test_each_stand_in_schema_has_the_real_ones_fields_types_and_defaults():
    import importlib

    built = schemas(INDEX)
    compared = 0
    for module, attribute in REGISTRIES.values():
        registry = getattr(importlib.import_module(module), attribute)
        for name in registry:
            real = registry.get(name).schema
            if real is None:
                continue
            stand_in = built[real.__name__]
            assert [f.name for f in dataclasses.fields(stand_in)] == [f.name for f in dataclasses.fields(real)], name
            assert OmegaConf.to_yaml(OmegaConf.structured(stand_in)) == OmegaConf.to_yaml(OmegaConf.structured(real))
            compared += 1
    assert compared == sum(1 for spec in INDEX["registries"].values() for schema in spec["names"].values() if schema)


def _gate_line(argv: list[str]) -> str:
    """The line the gate itself gives for ``argv`` (composed, then compiled: torch, the hook modules)."""
    with pytest.raises(ConfigError) as caught:
        compile_plan(compose_config(argv), argv)
    return str(caught.value)


@pytest.mark.parametrize("argv", CHOICE_MISTAKES, ids=lambda argv: argv[-1])
def test_a_choice_mistake_is_answered_before_the_gate_with_its_line(argv):
    assert compose_command_line(argv).problems == [_gate_line(argv)]


def test_a_choice_a_users_module_may_register_is_left_to_the_gate():
    argv = ["hooks=clip", "hooks.clip.type=mine", "+hooks.clip._module_=json"]
    assert compose_command_line(argv).problems == []
    assert "unknown hook type 'mine'" in _gate_line(argv)


@pytest.mark.parametrize("argv", [CHOICE_MISTAKES[0], CHOICE_MISTAKES[1], ["hooks=clip", "hooks.clip.maxx=1"]],
                         ids=lambda argv: argv[-1])
def test_a_mistake_imports_no_torch_and_says_its_one_line(argv, tmp_path):
    """The whole command: status 2, the gate's one line, and no torch, torchvision, pandas, pyarrow, numpy or hook
    module imported (Hydra imports the Slurm launcher plugin, whose job files write parquet only when a job ends)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "runner", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    imported = {m.group(1) for m in re.finditer(r"^import time:.*\|\s*([\w.]+)$", proc.stderr, re.M)}
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2
    assert lines == [f"error: {_gate_line(argv)}"]
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "torchvision", "pandas", "pyarrow", "numpy",
                                                             "matplotlib", "hooks")}
    assert not heavy, sorted(heavy)[:10]
    assert not list(tmp_path.iterdir()), "a mistake writes nothing"


@pytest.mark.slow
def test_the_startup_benchmark_measures_each_command_against_the_import(capsys):
    """``python -m benchmarks.startup`` with one round: every command ran with its own status (the
    mistake with 2 and its line), each row is against the import; no time is asserted."""
    from benchmarks import startup

    rows = startup.main(["--rounds", "1"])
    assert [row[0] for row in rows] == [startup.IMPORT[0], startup.PAUSED[0], startup.RUN[0], startup.MISTAKE[0]]
    assert rows[0][2:4] == ["+0.00", "1.00"]
    assert rows[2][5].startswith("≤ +0.5 s over the paused import (") and rows[3][5].startswith("< 1.0 s:")
    printed = capsys.readouterr().out
    assert f"the mistake's line: error: {_gate_line(['hooks=clip', 'hooks.clip.type=clmap'])}" in printed


class _JobsWouldRun(Exception):
    """Raised where ``python -m runner`` would hand its checked jobs to Hydra: the test stops there."""


def _run_main_block(monkeypatch, argv: list[str]) -> dict:
    """``runner/__main__.py`` run as ``python -m runner ARGV`` runs it (its ``__main__`` block included), stopped
    where the jobs would start; what the collector was doing at the resume and the full collections before it."""
    import gc
    import runpy

    from runner.cli import startup_gc

    seen: dict = {"full_collections": 0}
    real_resume = startup_gc.resume

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            seen["full_collections"] += 1

    def resume_then_stop(collect_first: bool) -> None:
        seen.update(paused_until_resume=not gc.isenabled(), collections_before=seen["full_collections"])
        real_resume(collect_first)
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(),
                    collections_in_resume=seen["full_collections"] - seen["collections_before"])
        raise _JobsWouldRun

    monkeypatch.setattr(startup_gc, "resume", resume_then_stop)
    monkeypatch.setattr(sys, "argv", ["runner", *argv])
    gc.callbacks.append(count)
    try:
        with pytest.raises(_JobsWouldRun):
            runpy.run_path(str(ROOT / "runner" / "__main__.py"), run_name="__main__")
    finally:
        gc.callbacks.remove(count)
        real_resume(False)  # a no-op unless the run stopped before its own resume
        gc.unfreeze()
        gc.enable()
    return seen


def test_the_cli_starts_with_the_collector_paused_and_runs_its_jobs_with_it_on(monkeypatch, tmp_path):
    """Start-up's objects (torch's among them) are frozen out of later collections; a single job's start-up
    garbage is frozen with them rather than collected (``runner.cli.startup_gc``)."""
    seen = _run_main_block(monkeypatch, ["hooks=none", "model=convnet", f"hydra.run.dir={tmp_path}/run"])
    assert seen["paused_until_resume"] and seen["collections_before"] == 0, seen
    assert seen["enabled"] and seen["frozen"] > 100_000, seen  # torch's objects, at least
    assert seen["collections_in_resume"] == 0


def test_a_sweeps_start_up_garbage_is_collected_before_the_freeze(monkeypatch, tmp_path):
    """A sweep's check leaves garbage in proportion to its jobs: one full collection frees it first."""
    seen = _run_main_block(monkeypatch, ["-m", "hooks=none", "model=convnet", "seed=1,2",
                                         f"hydra.sweep.dir={tmp_path}/sweep"])
    assert seen["paused_until_resume"] and seen["collections_before"] == 0, seen
    assert seen["enabled"] and seen["frozen"] > 100_000 and seen["collections_in_resume"] == 1, seen


def test_main_called_in_ones_own_process_leaves_its_collector_alone(monkeypatch, tmp_path):
    """A notebook or a test calling ``runner.__main__.main`` keeps its collector on and nothing frozen."""
    import gc

    import runner.__main__ as runner_main

    seen = {}
    monkeypatch.setattr(runner_main, "_run_jobs", lambda checked: seen.update(
        enabled=gc.isenabled(), frozen=gc.get_freeze_count()))
    monkeypatch.setattr(sys, "argv", ["runner", "hooks=none", "model=convnet", f"hydra.run.dir={tmp_path}/run"])
    runner_main.main()
    assert seen == {"enabled": True, "frozen": 0}
