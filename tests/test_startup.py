"""The command line is checked before torch is imported: every built-in choice is declared, with its schema,
by a module importing no torch (``hooks.specs``, ``runner.config.registry``), its implementation imported
only when it is built; a mistake in a choice is the gate's own line, and ``python -m runner`` answers one
without importing torch or a hook type's implementation."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import ConfigError
from runner.cli.commandline import check_command_line
from runner.cli.early import compose_command_line
from runner.config.compose import compose_config
from runner.engine.plan import compile_plan

ROOT = Path(__file__).resolve().parents[1]

#: One mistake in each kind of choice, each of which only the gate (with torch) caught before.
CHOICE_MISTAKES = [
    ["hooks=clip", "hooks.clip.type=clmap"],
    ["data.kind=randm"],
    ["loss.name=sums"],
    ["optimizer.name=sdg"],
    ["+logger.foo={}"],
    ["plots=[gradflow]"],
    ["metric.measures=[logitt]"],
]
#: The modules registering the built-in choices (each hook type's implementation among them).
REGISTERING = sorted(f"hooks.{path.parent.name}.{path.stem}" for path in (ROOT / "hooks").glob("*/*.py")
                     if path.stem != "__init__" and path.parent.name != "specs") + [
    "runner.sources", "runner.live", "runner.engine.metrics", "runner.analysis.plots", "runner.analysis.lens", "runner.analysis.graph"]
_REGISTRIES = ("from hooks.specs import HOOK_TYPES\n"
               "from runner.config.registry import DATA_KINDS, LOGGERS, LOSSES, METRICS, MODELS, OPTIMIZERS, PLOTS\n"
               "REGISTRIES = dict(hook_types=HOOK_TYPES, models=MODELS, data_kinds=DATA_KINDS, losses=LOSSES,"
               " optimizers=OPTIMIZERS, metrics=METRICS, loggers=LOGGERS, plots=PLOTS)\n")


def _python(code: str) -> dict:
    """What ``code``, run in a fresh interpreter, prints as JSON on its last line."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_built_in_choice_is_declared_and_its_module_registers_it():
    """Once every registering module is imported, each registry holds only declared choices (a registration
    without a declaration would be unknown to the command line) and each is registered by the module its
    declaration names (a declaration without a registration would fail when the choice is built). The
    loggers, whose modules import no torch, are registered by importing them, which the command line does."""
    found = _python(_REGISTRIES + f"import importlib, json\nfor m in {REGISTERING!r}: importlib.import_module(m)\n"
                    "print(json.dumps({label: {name: [e.module, e.registered, getattr(e.build, '__module__', None)]"
                    " for name, e in ((n, r._entries[n]) for n in r)} for label, r in REGISTRIES.items()}))")
    assert found["hook_types"] and all(len(names) > 1 for names in found.values()), found
    for label, names in found.items():
        for name, (module, registered, built_in) in names.items():
            if label == "loggers":
                assert module is None and registered and built_in.startswith("runner.live.to_"), (name, built_in)
                continue
            assert module is not None and registered, f"{label} '{name}' is registered without a declaration"
            if label == "hook_types":
                assert built_in == module, (name, module, built_in)


def test_declaring_imports_no_torch_and_building_imports_only_the_types_module():
    """Composing a job and checking its choices imports no torch and no hook type's implementation; building
    an entry imports its type's module (``hooks.types.gradients`` for ``clamp``), and only then."""
    seen = _python(
        "import json, sys\nfrom runner.cli.early import compose_command_line\n"
        "command = compose_command_line(['hooks=clip', 'model=convnet', 'data=randn', 'optimizer=sgd'])\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'numpy', 'pyarrow')"
        " or (m.startswith('hooks.') and not m.startswith('hooks.specs')))\n"
        "from hooks import HOOK_TYPES\nbuilt = HOOK_TYPES.get('clamp').build\n"
        "print(json.dumps(dict(problems=command.problems, before=before, built=built.__module__ + '.' + built.__name__,"
        " after='hooks.types.gradients' in sys.modules and 'hooks.types.observe' not in sys.modules)))")
    assert seen == {"problems": [], "before": [], "built": "hooks.types.gradients.Clamp", "after": True}


def test_a_run_of_a_model_of_the_runners_own_imports_no_torchvision(tmp_path):
    """torchvision (1.7 s of CPU to import: it imports torch._dynamo) is imported for a model of its own only."""
    seen = _python(
        "import json, sys\nfrom runner.cli.commandline import check_command_line\nfrom runner.engine import loop\n"
        f"checked = check_command_line(['model=mlp', 'hooks=stats', 'hydra.run.dir={tmp_path}'])\n"
        "loop.run(checked.plan_for(0, ['model=mlp', 'hooks=stats']), " + repr(str(tmp_path)) + ")\n"
        "print(json.dumps(dict(problems=checked.problems, torchvision='torchvision' in sys.modules)))")
    assert seen == {"problems": [], "torchvision": False}
    assert (tmp_path / "manifest.json").is_file()


def test_a_declaration_without_its_registration_fails_at_the_first_use(monkeypatch):
    """A declaration naming a module that does not register the choice is a bug said where it is built."""
    import hooks.types.observe  # noqa: F401  (registers stats, capture, print in the real table, not the copy below)
    from hooks.specs import HOOK_TYPES
    from hooks.specs.observe import ObserveSpec

    monkeypatch.setattr(HOOK_TYPES, "_entries", dict(HOOK_TYPES._entries))
    HOOK_TYPES.declare("undelivered", "hooks.types.observe", ObserveSpec)
    with pytest.raises(KeyError, match="hook type 'undelivered' is declared in hooks.types.observe, which does not "
                                       "register it"):
        HOOK_TYPES.get("undelivered")


def test_a_registration_with_another_schema_than_declared_is_refused(monkeypatch):
    from hooks.mechanism.registry import register
    from hooks.specs import HOOK_TYPES
    from hooks.specs.gradients import ScaleSpec
    from hooks.types.gradients import Clamp

    monkeypatch.setattr(HOOK_TYPES, "_entries", dict(HOOK_TYPES._entries))
    HOOK_TYPES.declare("clamp_twice", "hooks.types.gradients", ScaleSpec)
    with pytest.raises(KeyError, match="hook type 'clamp_twice' is declared with schema .*ScaleSpec.*, registered "
                                       "with .*ClampSpec"):
        register("clamp_twice")(Clamp)


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


def test_a_model_name_the_registries_lack_is_left_to_the_full_check_which_says_the_gates_line():
    """torchvision's model names are known by importing it: the command line leaves ``model.name`` to the gate,
    whose one line the full check gives (no file records torchvision's names)."""
    argv = ["model=convnet", "model.name=resnet19"]
    assert compose_command_line(argv).problems == []
    assert check_command_line(argv).problems == [_gate_line(argv)]
    assert "did you mean 'resnet18'?" in _gate_line(argv)


@pytest.mark.parametrize("argv", [CHOICE_MISTAKES[0], CHOICE_MISTAKES[1], ["hooks=clip", "hooks.clip.maxx=1"]],
                         ids=lambda argv: argv[-1])
def test_a_mistake_imports_no_torch_and_says_its_one_line(argv, tmp_path):
    """The whole command: status 2, the gate's one line, and no torch, torchvision, pandas, pyarrow, numpy or hook
    type's module imported, only ``hooks`` and its specs (Hydra imports the Slurm launcher plugin, whose job
    files write parquet only when a job ends)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "runner", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    imported = {m.group(1) for m in re.finditer(r"^import time:.*\|\s*([\w.]+)$", proc.stderr, re.M)}
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2
    assert lines == [f"error: {_gate_line(argv)}"]
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "torchvision", "pandas", "pyarrow", "numpy",
                                                             "matplotlib", "hooks")
             and m != "hooks" and not m.startswith("hooks.specs")}
    assert not heavy, sorted(heavy)[:10]
    assert "hooks.specs" in imported
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
