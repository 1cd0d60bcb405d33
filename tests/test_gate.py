"""One gate: every check a config passes is a function of ``GATE``, made once per run, before anything is written.

A check is a function whose code names ``ConfigError`` (or a subclass) or ``choice_error``. The
``watch`` fixture sees every Python call of the test's thread (``sys.setprofile``) and

* counts the calls of each ``GATE`` function (by its code, so a module holding it under another
  name, or a builder calling it again, is counted too);
* inside ``compile_plan`` and ``runner.attach`` (until the run opens: ``open_run``), finds every
  check that is not a ``GATE`` function nor called from one: a check written in line there, or a
  new check function not listed, is a stray;
* after the gate (``after_gate()``: the run), finds every check the gate did not reach already and
  that is not one of ``AFTER_THE_GATE``, each with why only the run can say it: a config check made
  in the run (after Hydra wrote ``RUN_DIR/.hydra/``, as ``stop_after=conv9`` once was) is one.
"""
from __future__ import annotations

import inspect
import sys
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import nn

from common.errors import ConfigError, choice_error

import runner
from hooks.kernels import tensor_kinds
from hooks.mechanism import tap
from runner.analysis import intact
from runner.cli import execute as execute_module, replay
from runner.cli.commandline import check_command_line
from runner.config.compose import compose_config
from runner.engine import attach as attach_module, attach_plan, loop, plan as plan_module, steps
from runner.sources import data as data_module
from runner.store import claim, ranks

GATE = plan_module.GATE
#: What ``runner.attach`` checks of its own, which a command line has no use for.
ATTACH_ONLY = {plan_module.attach_config, plan_module.check_attached_model, plan_module.rehearse_call}
#: What ``runner.attach`` checks (it builds no model, data, loss or optimizer of its own).
ATTACH = ATTACH_ONLY | {plan_module._typed, plan_module._import_modules, plan_module._steps_or_epochs,
                        plan_module._check_settings, plan_module.check_fsdp, plan_module.check_metric,
                        plan_module._check_repeated_presets, plan_module.compile_hooks, plan_module.build_hooks,
                        plan_module.check_budget}


def _code(fn: Callable):
    return inspect.unwrap(fn).__code__


#: Checks only the run can make, with why: none of them is a mistake of the config the gate could have seen.
AFTER_THE_GATE = {
    execute_module.execute: "the CLI's job: a run's one-line error becomes its exit status",
    ranks.rank_part.__wrapped__: "the run directory's claim, shared by the ranks of a distributed run",
    loop._available: "CUDA on the node the job runs on (a sweep's plan may be compiled on a login node)",
    loop._explained: "a pass that failed, explained by the entry that made it fail",
    steps.report_silent: "an entry that matched but recorded nothing in step 0 (on_silent=error)",
    data_module._targets: "class targets for each batch the data yields (a last batch may be smaller)",
    tensor_kinds.check_held: "a tensor whose storage was freed under a hook (FSDP2), seen when the hook reads it",
    attach_module._checked: "the measures a user's loop passes to run.step()",
    attach_module.AttachedRun.evaluating.__wrapped__: "run.evaluating() called by a user's loop before its first step",
    attach_module.attach.__wrapped__: "runner.attach's errors in a Python caller's terms (python_remedies)",
    tap.apply_edit: "what an edit returns for a parameter's gradient: runner.attach's first-call rehearsal puts meta "
                 "tensors in the parameters' place, whose hooks it does not reach",
    tensor_kinds.edited: "the same edit, on the tensor kind it is given (hooks.kernels.tensor_kinds)",
    intact.check_on_corrupt: "a run read back (the summary), once it is written",
}


class Watch:
    """The calls of a test's thread, sorted as the module doc says."""

    def __init__(self) -> None:
        self.gate = {fn.__code__: fn for fn in GATE}
        self.entries = {_code(plan_module.compile_plan), _code(attach_module.attach)}
        self.run_opens = _code(attach_module.open_run)
        self.after = {fn.__code__ for fn in AFTER_THE_GATE}
        self.calls: Counter = Counter()
        self.reached: set = set()  # checks made under a GATE function
        self.strays: list[str] = []  # checks made in the gate outside GATE
        self.in_run: list[str] = []  # checks made in the run that the gate did not make
        self.judging_run = False
        self._checks: dict = {}

    def after_gate(self) -> None:
        """From here on, a check the gate did not reach is one made in the run."""
        self.judging_run = True

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code in self.gate:
            self.calls[self.gate[code]] += 1
        if not self._is_check(frame):
            return
        stack = []
        while frame is not None:
            stack.append(frame.f_code)
            frame = frame.f_back
        if any(c in self.gate for c in stack):
            self.reached.add(code)
        elif any(c in self.entries for c in stack) and self.run_opens not in stack:
            self.strays.append(_name(code))
        elif self.judging_run and code not in self.reached and code not in self.after:
            self.in_run.append(_name(code))

    def _is_check(self, frame) -> bool:
        code = frame.f_code
        if code not in self._checks:
            names = [frame.f_globals.get(name) for name in code.co_names]
            self._checks[code] = code.co_name != "<module>" and (
                {"ConfigError", "choice_error"} & set(code.co_names) != set() or any(
                    value is choice_error or (isinstance(value, type) and issubclass(value, ConfigError))
                    for value in names))
        return self._checks[code]

    def counted(self, *fns) -> dict[str, int]:
        return {fn.__qualname__: self.calls[fn] for fn in fns}


def _name(code) -> str:
    return f"{code.co_filename.rsplit('/', 2)[-2]}/{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"


@pytest.fixture
def watch(monkeypatch):
    """A ``Watch`` of the test's calls, with the output directory's check counted too."""
    seen = Watch()
    seen.gate[claim.check_output_dir.__code__] = claim.check_output_dir
    before = sys.getprofile()
    sys.setprofile(seen)
    yield seen
    sys.setprofile(before)


def _once(watch: Watch, fns) -> None:
    """Each of ``fns`` (and the output directory's check) called once, and no other GATE function at all."""
    wanted = {*fns, claim.check_output_dir}
    assert watch.counted(*wanted) == {fn.__qualname__: 1 for fn in wanted}
    assert {fn.__qualname__ for fn in watch.calls if fn not in wanted} == set()


def _clean(watch: Watch) -> None:
    assert watch.strays == [], "checks made in the gate outside GATE"
    assert watch.in_run == [], f"checks made in the run that the gate did not make: {watch.in_run}"


def test_gate_lists_functions_each_once():
    assert all(inspect.isfunction(fn) for fn in GATE) and len(set(GATE)) == len(GATE)


def _checkpointed(tmp_path) -> list[str]:
    weights = tmp_path / "w.pt"
    torch.save(nn.Linear(3, 3).state_dict(), weights)
    return ["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=3", "+model.out_features=3",
            "model.input_shape=[2,3]", f"model.checkpoint={weights}", "hooks=[clip,stats]", "optimizer=sgd",
            "steps=2", "eval_every=1"]


#: A pass over a dataset of one's own, stopped after ``fc1``: epochs, shards and the stop are checked.
DATASET_PASS = ["model=mlp", "data=dataset", "data._target_=datasets_for_tests.Squares", "data.batch_size=4",
                "mode=eval", "epochs=1", "loss=none", "hooks=extract", "hooks.extract.layers=fc1", "stop_after=fc1"]


@pytest.mark.parametrize("argv, not_reached", [
    (_checkpointed, {plan_module.check_hf}),
    (lambda tmp_path: DATASET_PASS, {plan_module.check_hf, plan_module.check_target}),
], ids=["checkpoint-clip-stats-sgd-eval", "dataset-pass-stop-after"])
def test_each_check_runs_once_for_one_command_line_run_and_none_outside_the_gate(watch, tmp_path, argv, not_reached):
    argv = argv(tmp_path)
    checked = check_command_line(argv)  # what ``python -m runner ARGV`` does before Hydra starts, in this process
    assert checked.problems == []
    cfg = compose_config(argv)  # Hydra's job composes it again
    watch.after_gate()
    execute_module.execute(cfg, tmp_path / "run", argv, plan=checked.plan_for(0, argv))
    assert (tmp_path / "run" / "manifest.json").is_file()
    _once(watch, set(GATE) - ATTACH_ONLY - not_reached)
    _clean(watch)


def _attach_run(watch: Watch, out) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with runner.attach(model, hooks=["clip", "stats"], out_dir=out) as run:
        watch.after_gate()  # the first call's rehearsal is the gate's still (rehearse_call)
        for _ in range(2):
            loss = model(torch.randn(5, 3)).sum()
            run.backward(loss)
            run.step(loss)
    assert (out / "manifest.json").is_file()


def test_each_check_runs_once_for_one_attach_run_and_none_outside_the_gate(watch, tmp_path, monkeypatch):
    monkeypatch.setattr(attach_plan, "_COMPILED", {})  # no plan kept from an earlier test's block
    _attach_run(watch, tmp_path / "run")
    _once(watch, ATTACH)
    _clean(watch)


def test_a_block_of_arguments_compiled_before_makes_only_the_models_checks(watch, tmp_path, monkeypatch):
    monkeypatch.setattr(attach_plan, "_COMPILED", {})
    _attach_run(watch, tmp_path / "first")
    watch.calls.clear()
    watch.judging_run = False
    _attach_run(watch, tmp_path / "second")  # its plan kept (runner.engine.attach_plan): the model is new
    _once(watch, {plan_module.check_attached_model, plan_module.rehearse_call, plan_module.check_budget})
    _clean(watch)


def test_each_check_runs_once_for_one_replay(watch, run_with, tmp_path):
    sys.setprofile(None)  # the stored run's own compile is not the replay's
    stored = run_with("model=mlp", "data.shape=[2,100]", "hooks=clip", "steps=2")
    sys.setprofile(watch)
    assert replay.main([f"replay={stored}", f"replay.out={tmp_path / 'again'}"]) == 0
    _once(watch, set(GATE) - ATTACH_ONLY - {plan_module.check_hf, plan_module.check_target})
    assert watch.strays == []


# -- the watch finds a check outside the gate: a new one, in the gate or in the run -----------------
def _stray_check(settings) -> None:  # a check added without listing it in GATE
    if settings.seed < 0:
        raise ConfigError(f"seed: {settings.seed} must be at least 0")


def test_a_check_added_to_compile_plan_outside_gate_is_found(watch, monkeypatch):
    real = plan_module.compile_settings

    def compile_settings_then_a_stray(cfg, overrides=(), replaced=None):
        typed, settings = real(cfg, overrides, replaced)
        _stray_check(settings)
        return typed, settings

    monkeypatch.setattr(plan_module, "compile_settings", compile_settings_then_a_stray)
    plan_module.compile_plan(compose_config(["model=linear", "hooks=stats"]))
    assert watch.strays == ["tests/test_gate.py:_stray_check"]


def test_a_check_written_in_line_in_compile_plan_is_found(watch, monkeypatch):
    source = inspect.getsource(plan_module.compile_plan).replace(
        "    meta = meta_model(model)\n",
        "    if settings.seed < 0:\n        raise ConfigError('seed: must be at least 0')\n    meta = meta_model(model)\n")
    namespace = dict(vars(plan_module))
    exec(compile(source, plan_module.__file__, "exec"), namespace)  # noqa: S102 - compile_plan with one line more
    watch.entries.add(namespace["compile_plan"].__code__)
    namespace["compile_plan"](compose_config(["model=linear", "hooks=stats"]))
    assert watch.strays == ["engine/plan.py:compile_plan"]


def test_a_check_made_in_the_run_is_found(watch, tmp_path, monkeypatch):
    real = loop.build_model

    def build_model_then_a_stray(model_cfg):  # a check the run makes, as stop_after's once was
        if model_cfg.get("name") == "nope":
            raise ConfigError("model.name: nope")
        return real(model_cfg)

    argv = ["model=linear", "hooks=stats", "steps=1"]
    checked = check_command_line(argv)
    cfg = compose_config(argv)
    watch.after_gate()
    monkeypatch.setattr(loop, "build_model", build_model_then_a_stray)
    execute_module.execute(cfg, tmp_path / "run", argv, plan=checked.plan_for(0, argv))
    assert watch.in_run == ["tests/test_gate.py:build_model_then_a_stray"]


# -- what the gate refuses, it refuses before Hydra writes anything ------------------------------
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
