"""A new data source, optimizer and hook type, each one Python module plus one YAML file outside the
project (a tmp dir on ``sys.path`` and a conf dir on Hydra's search path), run through the command
line and ``runner.attach`` against the same computation in plain PyTorch; a hook type added to the project
(its spec declared in a new module of ``hooks/specs/``, its class in one of ``hooks/``), known to the
command line before its class is imported; a new picture, one module."""
from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra.core.config_store import ConfigStore
from torch import nn

from common.errors import ConfigError
import runner
import runner.analysis as analysis
from hooks import HOOK_TYPES
from runner.cli.commandline import check_command_line
from runner.cli.early import compose_command_line
from runner.cli.execute import execute
from runner.config.compose import CONF_DIR, compose_config
import runner.analysis.plots  # noqa: F401  (the built-in pictures, registered before the fixture copies PLOTS)
from conftest import cli
import runner.config.registry as runner_registries
from runner.config.registry import DATA_KINDS, METRICS, OPTIMIZERS, PLOTS
from runner.engine.plan import compile_plan
from runner.sources.models import MLP

#: A hook type's spec and its implementation, the same in a user's one module and in the project's two (the
#: spec in ``hooks/specs/``, declared; the class in ``hooks/``).
SCALE_SPEC = '''

        @dataclass
        class ScaleOutputSpec(HookSpec):
            layers: Any = "**"
            factor: float = 1.0


        '''
SCALE_HOOK = '''
        class ScaleOutput(HookType):
            spec_class = ScaleOutputSpec
            pytorch_hooks = "register_forward_hook"
            expected_kinds = frozenset({"output"})

            def attach(self, model, session):
                for layer, module in self.targets(model):
                    session.add(module.register_forward_hook(self._hook(session.recorder, layer)))

            def _hook(self, recorder, layer):
                def scale(module, args, output):
                    output = output * self.spec.factor
                    recorder.record(output, hook=self.name, layer=layer, phase="forward", kind="output", slot="0",
                                    call=recorder.next_call((self.name, layer)))
                    return output
                return scale
    '''
MODULES = {
    "fixture_counting_data": '''
        """data=counting: batches start + step + arange, in the shape asked for."""
        import itertools
        from dataclasses import dataclass

        import torch

        from runner.config.registry import DATA_KINDS
        from runner.config.schema import DataBase
        from runner.sources.batches import Maker, input_shape


        @dataclass
        class CountingData(DataBase):
            kind: str = "counting"
            start: float = 0.0


        @DATA_KINDS.register("counting", schema=CountingData)
        def counting(data, model):
            shape = input_shape(data, model)
            count = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
            return Maker(shape, torch.float32,
                         lambda gen: ((count + data.start + step, None) for step in itertools.count()))
    ''',
    "fixture_plain_step": '''
        """optimizer=plain_step: p -= lr * grad, nothing else."""
        from dataclasses import dataclass

        import torch

        from runner.config.registry import OPTIMIZERS


        @dataclass
        class PlainStepConfig:
            name: str = "plain_step"
            lr: float = 0.1


        @OPTIMIZERS.register("plain_step", schema=PlainStepConfig)
        class PlainStep(torch.optim.Optimizer):
            def __init__(self, params, lr):
                super().__init__(params, {"lr": lr})

            @torch.no_grad()
            def step(self):
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(p.grad, alpha=-group["lr"])
    ''',
    "fixture_scale_output": """
        \"\"\"hooks type scale_output: a forward hook multiplying the output by factor, recording it.\"\"\"
        from dataclasses import dataclass
        from typing import Any

        from hooks.mechanism.base import HookSpec, HookType
        from hooks.mechanism.registry import register
    """ + SCALE_SPEC + '@register("scale_output")' + SCALE_HOOK,
    "fixture_target_probability": '''
        """metric.measures=[target_probability]: the batch mean of softmax(logits)[metric.target]."""
        from runner.config.registry import METRICS


        @METRICS.register("target_probability")
        def target_probability(metric):
            if metric.target is None:
                return None
            return lambda logits: logits.softmax(-1)[:, metric.target].mean()
    ''',
    "fixture_loss_picture": '''
        """plots=[loss_per_step]: the run's loss per step, drawn from steps.parquet."""
        from runner.analysis.load import load_steps
        from runner.analysis.plots import Picture, loss_curves
        from runner.config.registry import PLOTS


        @PLOTS.register("loss_per_step")
        class LossPerStep(Picture):
            @staticmethod
            def missing(hooks, loss_fn):
                return None if loss_fn is not None else "a loss; use e.g. loss=sum"

            @staticmethod
            def draw(run_dir, cfg, step, notes):
                return [("loss_per_step.png", loss_curves(load_steps(run_dir)))]
    ''',
}
PRESETS = {
    "data/counting.yaml": "_module_: fixture_counting_data\nkind: counting\nshape: [2, 100]\nstart: 0.5\n",
    "optimizer/plain_step.yaml": "_module_: fixture_plain_step\nname: plain_step\nlr: 0.05\n",
    "hooks/scaled.yaml": "# @package hooks.scaled\n_module_: fixture_scale_output\ntype: scale_output\n"
                         "layers: fc2\nfactor: 3.0\n",
}


@pytest.fixture
def own_parts(tmp_path, monkeypatch):
    """The three modules importable from a tmp dir, their presets in a tmp conf dir; registrations undone after."""
    code, conf = tmp_path / "code", tmp_path / "conf"
    for name, text in MODULES.items():
        (code / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (code / f"{name}.py").write_text(textwrap.dedent(text))
    for path, text in PRESETS.items():
        (conf / path).parent.mkdir(parents=True, exist_ok=True)
        (conf / path).write_text(text)
    monkeypatch.syspath_prepend(str(code))
    for registry in (DATA_KINDS, OPTIMIZERS, PLOTS, METRICS, HOOK_TYPES):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield f"hydra.searchpath=[file://{conf}]"
    for name in MODULES:
        sys.modules.pop(name, None)


def _oracle_losses(steps: int, factor: float, lr: float) -> list[float]:
    torch.manual_seed(0)  # the run's seed, before the model is built
    model = MLP()
    count = torch.arange(200, dtype=torch.float32).reshape(2, 100)
    losses = []
    for step in range(steps):
        model.zero_grad()
        out = model.fc2(model.relu(model.fc1(count + 0.5 + step))) * factor
        loss = out.sum()
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return losses


def test_a_module_that_does_not_import_is_one_line_naming_its_key(own_parts):
    with pytest.raises(ConfigError, match=r"^data\._module_: cannot import 'no_such_module': ModuleNotFoundError"):
        compile_plan(compose_config([own_parts, "model=mlp", "data=counting", "data._module_=no_such_module"]))


def test_every_preset_of_a_registered_group_names_a_registered_choice_with_its_schema_stored():
    stored = ConfigStore.instance().repo
    for group, registry, key in (("data", DATA_KINDS, "kind"), ("optimizer", OPTIMIZERS, "name")):
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            name = compose_config([f"{group}={path.stem}"])[group][key]
            assert name in registry, path
            assert f"{name}.yaml" in stored[f"{group}_schema"], path


def test_own_picture_is_drawn_and_checked_from_its_module_alone(own_parts, tmp_path, capsys):
    importlib.import_module("fixture_loss_picture")
    cli(["model=mlp", "loss=sum", "steps=2", "plots=[loss_per_step]"], tmp_path / "run")
    png = (tmp_path / "run" / "loss_per_step.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    with pytest.raises(ConfigError, match=r"^plots: 'loss_per_step' needs a loss; use e\.g\. loss=sum$"):
        compile_plan(compose_config(["model=mlp", "loss=none", "plots=[loss_per_step]"]))
    with pytest.raises(ConfigError, match=r"^plots\[1\]: unknown plot 'loss_per_stp'; valid: attribution_graph, feature_maps, "
                                          r"grad_cam, gradient_flow, logit_lens, loss_per_step; did you mean 'loss_per_step'\?$"):
        compile_plan(compose_config(["model=mlp", "plots=[loss_per_step,loss_per_stp]"]))


def test_own_measure_is_one_module_and_becomes_a_steps_column(own_parts, tmp_path):
    argv = [own_parts, "model=mlp", "data=counting", "hooks=[]", "loss=sum", "steps=2", "metric.target=1",
            "metric._module_=fixture_target_probability", "metric.measures=[logit,target_probability]"]
    cli(argv, tmp_path / "run")
    steps = analysis.load_steps(tmp_path / "run")
    torch.manual_seed(0)
    model = MLP()
    count = torch.arange(200, dtype=torch.float64).reshape(2, 100)
    with torch.no_grad():
        outs = [model.double()(count + 0.5 + step) for step in range(2)]
    assert steps.target_probability.tolist() == pytest.approx([float(o.softmax(-1)[:, 1].mean()) for o in outs],
                                                              rel=1e-5)
    assert steps.logit.tolist() == pytest.approx([float(o[:, 1].mean()) for o in outs], rel=1e-5)
    assert "logit_diff" not in steps.columns  # no metric.diff: a column no step gave is left out


def test_an_unknown_or_clashing_measure_is_one_line(own_parts):
    base = [own_parts, "model=mlp", "metric.target=1", "metric._module_=fixture_target_probability"]
    with pytest.raises(ConfigError, match=r"^metric\.measures: unknown per-step measure 'target_probabilty'; valid: "
                                          r"logit, logit_diff, target_probability; did you mean 'target_probability'\?$"):
        compile_plan(compose_config([*base, "metric.measures=[target_probabilty]"]))
    METRICS.register("loss")(lambda metric: lambda logits: 0.0)
    with pytest.raises(ConfigError, match=r"^metric\.measures: 'loss' is a column steps\.parquet already has"):
        compile_plan(compose_config([*base, "metric.measures=[loss]"]))


def _project_trees() -> list[tuple[str, ast.Module]]:
    root = Path(__file__).resolve().parents[1]
    return [(".".join(path.relative_to(root).with_suffix("").parts), ast.parse(path.read_text()))
            for package in ("common", "hooks", "runner") for path in sorted((root / package).rglob("*.py"))]


def test_one_registry_class_keeps_every_choice_a_config_names():
    """Hook types, models, data kinds, losses, optimizers, measures, loggers and plots are each a
    ``common.registry.Registry``: one way to register (storing the schema), one error line. No other
    class registers, and a ``register`` decorator of a module (``hooks.register``) hands its choice to one."""
    from common.registry import Registry

    registries = {name: value for name, value in vars(runner_registries).items()
                  if name.isupper() and name != "MODULE_KEY"} | {"HOOK_TYPES": HOOK_TYPES}
    assert sorted(registries) == ["DATA_KINDS", "HOOK_TYPES", "LOGGERS", "LOSSES", "METRICS", "MODELS",
                                  "OPTIMIZERS", "PLOTS"]
    assert {name: type(value) for name, value in registries.items()} == dict.fromkeys(registries, Registry)
    trees = _project_trees()
    classes = sorted(f"{module}.{node.name}" for module, tree in trees for node in ast.walk(tree)
                     if isinstance(node, ast.ClassDef)
                     and any(isinstance(f, ast.FunctionDef) and f.name == "register" for f in node.body))
    assert classes == ["common.registry.Registry"]
    decorators = [(module, any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                               and call.func.attr == "register" for call in ast.walk(fn)))
                  for module, tree in trees for fn in tree.body
                  if isinstance(fn, ast.FunctionDef) and fn.name == "register"]
    assert decorators == [("hooks.mechanism.registry", True)]
    with pytest.raises(ConfigError) as bad:
        HOOK_TYPES.get("clmap", key="hooks.clip.type")
    assert str(bad.value) == f"hooks.clip.type: unknown hook type 'clmap'; valid: {', '.join(sorted(HOOK_TYPES))}; " \
                             "did you mean 'clamp'?"


def test_a_hook_type_registered_late_stores_its_schema_for_presets_to_inherit(own_parts, tmp_path):
    """A user's hook type, registered when its module is imported (long after the built-in ones),
    stores ``hook_schema/TYPE`` with ``type`` filled in: a preset composed after that inherits its keys,
    defaults and key checks, as the built-in presets do."""
    importlib.import_module("fixture_scale_output")
    stored = ConfigStore.instance().load("hook_schema/scale_output.yaml").node
    assert (stored.type, stored.factor) == ("scale_output", 1.0)
    (tmp_path / "conf" / "hooks" / "inherited.yaml").write_text(
        "# @package hooks.inherited\ndefaults:\n  - /hook_schema/scale_output@_here_\n  - _self_\nlayers: fc2\n")
    entry = compose_config([own_parts, "model=mlp", "hooks=inherited"]).hooks.inherited
    assert (entry.type, entry.layers, entry.factor) == ("scale_output", "fc2", 1.0)
    with pytest.raises(ConfigError, match=r"hooks\.inherited\.factr"):
        compose_config([own_parts, "model=mlp", "hooks=inherited", "hooks.inherited.factr=2"])


#: A hook type added to the project as "Where a new thing goes" (docs/explanation/architecture.md) says: its
#: spec in a new module of ``hooks/specs/`` declaring it, its class in a new module of ``hooks/``, its preset
#: in ``conf/hooks/`` inheriting ``hook_schema/TYPE`` (no ``_module_``). Nothing else is touched.
PROJECT_TYPE = {
    "specs/fixture_times.py": """
        \"\"\"times: the spec of a forward hook multiplying the output by factor.\"\"\"
        from dataclasses import dataclass
        from typing import Any

        from hooks.specs.base import HOOK_TYPES, HookSpec
    """ + SCALE_SPEC + 'HOOK_TYPES.declare("times", "hooks.fixture_times", ScaleOutputSpec)\n',
    "fixture_times.py": """
        \"\"\"times: the forward hook multiplying the output by factor, recording it.\"\"\"
        from hooks.mechanism.base import HookType
        from hooks.mechanism.registry import register
        from hooks.specs.fixture_times import ScaleOutputSpec


        @register("times")""" + SCALE_HOOK,
}


@pytest.fixture
def project_type(own_parts, tmp_path, monkeypatch):
    """The project's ``hooks/`` and ``hooks/specs/`` extended by a folder each (their package paths), as if the
    two modules were added there; the preset beside the other fixtures' presets. Undone after."""
    import hooks
    import hooks.specs

    for path, text in PROJECT_TYPE.items():
        (tmp_path / "project" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "project" / path).write_text(textwrap.dedent(text))
    monkeypatch.setattr(hooks, "__path__", [*hooks.__path__, str(tmp_path / "project")])
    monkeypatch.setattr(hooks.specs, "__path__", [*hooks.specs.__path__, str(tmp_path / "project" / "specs")])
    (tmp_path / "conf" / "hooks" / "tripled.yaml").write_text(
        "# @package hooks.tripled\ndefaults:\n  - /hook_schema/times@_here_\n  - _self_\nlayers: fc2\nfactor: 3.0\n")
    hooks.specs.declare_all()  # what importing hooks.specs does: every module of the room
    yield own_parts
    for name in ("hooks.specs.fixture_times", "hooks.fixture_times"):
        sys.modules.pop(name, None)


def test_a_project_hook_type_is_known_to_the_command_line_before_its_module_is_imported(project_type):
    assert "hooks.fixture_times" not in sys.modules
    entry = compose_config([project_type, "model=mlp", "hooks=tripled"]).hooks.tripled
    assert (entry.type, entry.layers, entry.factor) == ("times", "fc2", 3.0)
    with pytest.raises(ConfigError, match=r"^hooks\.tripled\.factr: unknown key of hooks\.tripled 'factr'"):
        compose_config([project_type, "model=mlp", "hooks=tripled", "hooks.tripled.factr=2"])
    problems = compose_command_line([project_type, "model=mlp", "hooks=tripled", "hooks.tripled.type=timez"]).problems
    assert len(problems) == 1 and problems[0].startswith("hooks.tripled.type: unknown hook type 'timez'; valid: ")
    assert " times, " in problems[0] and problems[0].endswith("did you mean 'times'?")
    assert "hooks.fixture_times" not in sys.modules


@pytest.fixture(params=["own", "project"])
def hook_preset(request):
    """The search path and the preset of a hook type added either way: a user's one module (``hooks=scaled``,
    imported through ``_module_``) or the project's spec and class (``hooks=tripled``)."""
    if request.param == "own":
        return request.getfixturevalue("own_parts"), "scaled"
    return request.getfixturevalue("project_type"), "tripled"


def test_own_data_optimizer_and_hook_type_run_through_the_command_line(hook_preset, tmp_path):
    searchpath, preset = hook_preset
    argv = [searchpath, "model=mlp", "data=counting", "optimizer=plain_step", f"hooks={preset}", "loss=sum", "steps=3"]
    checked = check_command_line(argv)
    assert checked.problems == []
    cfg = compose_config(argv)
    execute(cfg, tmp_path / "run", argv, plan=checked.plan_for(0, argv))
    steps = analysis.load_steps(tmp_path / "run")
    assert steps.loss.tolist() == pytest.approx(_oracle_losses(3, 3.0, 0.05), rel=1e-5)
    stats = analysis.load_stats(tmp_path / "run")
    scaled = stats[stats.hook == preset]
    assert sorted(scaled.step.unique()) == [0, 1, 2] and set(scaled.layer) == {"fc2"}


def test_own_hook_type_runs_in_runner_attach(hook_preset, tmp_path):
    searchpath, preset = hook_preset
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    plain = model(x).detach()
    with runner.attach(model, hooks=[preset], overrides=[searchpath, f"hooks.{preset}.layers='2'"],
                       out_dir=tmp_path / "run") as run:
        out = model(x)
        run.backward(out.sum())
        run.step(out.sum())
    torch.testing.assert_close(out, plain * 3.0)
    stats = analysis.load_stats(tmp_path / "run")
    row = stats[(stats.hook == preset) & (stats.kind == "output")].iloc[0]
    assert row.layer == "2"
    assert row["max"] == pytest.approx(float((plain * 3.0).max()), rel=1e-6)


def test_the_names_a_spec_accepts_are_the_ones_its_hook_applies():
    """A spec checks its values without torch; the hook maps the same names to what torch does."""
    from hooks.types import edits, sae, saved
    from hooks.specs import edits as edit_specs, sae as sae_specs, saved as saved_specs, units as unit_specs

    assert tuple(edits.OPS) == edit_specs.OPS
    assert tuple(sae.EDIT_OPS) == sae_specs.OPS
    assert tuple(saved.DTYPES) == saved_specs.DTYPES
    finfo = torch.finfo(torch.float32)
    assert (unit_specs.FLOAT32.tiny, unit_specs.FLOAT32.max) == (finfo.tiny, finfo.max)
