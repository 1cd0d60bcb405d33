"""No module of runner/ (engine, analysis, command line, report, pictures, live loggers) tests a hook type's name:
what a type means to them (its answer, its report section, what generation needs of it, whether a live logger
shows its rows) is declared by the type with its spec (``hooks/specs/``: ``HookSpec.answers``, ``section``,
``stored_run``, ``without_side_pass``, ``logged_live``, ``pictures``) and asked of it, so a type added in its own
module, from a folder outside the project, is answered at the end of its run and in a report made by another
process, with no runner file touched.

Read with ``ast``: a string constant equal to a registered type's name (``HOOK_TYPES``) as an operand of a
comparison (``==``, ``!=``, ``in``, ``<=``, ..., also as an item of a tuple, list or set operand), as a key of a
dict literal, or as a value in a ``match`` case is a test of that name. A type's name elsewhere (a docstring, an
error message, a column read by name) is not."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import run_main
from test_registries import SCALE_HOOK
from hooks.specs import HOOK_TYPES
from runner.analysis.summary import entry_types
from runner.sources.models import MLP

ROOT = Path(__file__).resolve().parents[1]


def type_name_tests(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each place ``source`` tests one of ``names`` (the module's doc says which places)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                found += [item for item in items if isinstance(item, ast.Constant)]
        elif isinstance(node, ast.Dict):
            found += [key for key in node.keys if isinstance(key, ast.Constant)]
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant):
            found.append(node.value)
        elif isinstance(node, ast.MatchMapping):
            found += [key for key in node.keys if isinstance(key, ast.Constant)]
    return sorted((constant.lineno, constant.value) for constant in found if constant.value in names)


def test_the_finder_finds_each_way_of_testing_a_name():
    source = '''
if spec.type == "patch": pass
if kind in ("units", "other"): pass
if {"steer", "x"} <= set(methods): pass
TABLE = {"clamp": 1, "other": 2}
match kind:
    case "store" | "dla": pass
    case {"logit_lens": _}: pass
said = f"the patch of {kind}", ["patch"], rows["units"], call("steer")
'''
    assert type_name_tests(source, set(HOOK_TYPES)) == [(2, "patch"), (3, "units"), (4, "steer"), (5, "clamp"),
                                                          (7, "dla"), (7, "store"), (8, "logit_lens")]


def test_no_module_of_the_runner_tests_a_hook_types_name():
    names = set(HOOK_TYPES)
    assert {"patch", "units", "steer", "stats", "clamp"} <= names  # the registry is read, not an empty set
    found = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in sorted((ROOT / "runner").rglob("*.py"))
             for line, name in type_name_tests(path.read_text(), names)]
    assert found == [], "a hook type's name tested outside hooks/ (declare it with the type's spec):\n" + "\n".join(found)


#: A user's hook type in one module: ``test_registries``' forward hook scaling its layers' outputs (here by 1)
#: and recording them, whose spec declares its own answer (the largest output it saw) and report section;
#: nothing of it is named anywhere in the project.
OWN_TYPE = """
        \"\"\"hooks type said_max: records each output; answers with the largest value it saw.\"\"\"
        from dataclasses import dataclass
        from typing import Any

        from hooks.mechanism.base import HookType
        from hooks.mechanism.registry import register
        from hooks.specs import Answers, HookSpec, Section


        @dataclass
        class ScaleOutputSpec(HookSpec):
            answers = Answers("fixture_said_max:said_max")
            section = Section("said", "Said by its own type", "fixture_said_max:said_section", after="summary")

            layers: Any = "**"
            factor: float = 1.0


        @register("said_max")""" + SCALE_HOOK + '''

        def _largest(run_dir, entry):
            from runner.analysis.load import load_stats

            stats = load_stats(run_dir)
            return float(stats[(stats.hook == entry) & (stats.kind == "output")]["max"].max())


        def said_max(run_dir, entry):
            from runner.analysis.answers import Answer

            return Answer([f"largest output {_largest(run_dir, entry)!r}, said by its own type"])


        def said_section(path, runs, steps, corrupted, on_corrupt):
            return f"<p>own section: largest output {_largest(runs[0], 'said')!r}</p>"
'''


@pytest.fixture
def own_type(tmp_path, monkeypatch):
    """``OWN_TYPE`` importable from a folder of its own, its preset in another; its registration undone after."""
    code, conf = tmp_path / "code", tmp_path / "conf" / "hooks"
    code.mkdir()
    conf.mkdir(parents=True)
    (code / "fixture_said_max.py").write_text(textwrap.dedent(OWN_TYPE))
    (conf / "said.yaml").write_text("# @package hooks.said\n_module_: fixture_said_max\ntype: said_max\nlayers: fc2\n")
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setattr(HOOK_TYPES, "_entries", dict(HOOK_TYPES._entries))
    yield code, f"hydra.searchpath=[file://{conf.parent}]"
    sys.modules.pop("fixture_said_max", None)


def test_a_type_from_its_own_folder_is_answered_by_its_own_declaration(own_type, tmp_path, monkeypatch, capsys):
    code, searchpath = own_type
    run = tmp_path / "run"
    ran = run_main(monkeypatch, capsys, searchpath, "model=mlp", "data=ones", "data.shape=[2,100]", "hooks=said",
                   "loss=sum", "steps=1", "progress=false", f"hydra.run.dir={run}")
    assert ran.code == 0, ran.stderr
    torch.manual_seed(0)  # the run's seed, before its model is built
    model = MLP()
    largest = float(model(torch.ones(2, 100)).detach().double().max())  # the first step's forward: no update yet
    said = re.search(r"^  said \(said_max\): largest output (\S+), said by its own type$", ran.stdout, re.M)
    assert said is not None, ran.stdout
    assert float(said.group(1)) == pytest.approx(largest, rel=1e-6)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(ROOT)])}
    report = subprocess.run([sys.executable, "-m", "runner.report", str(run)], env=env, capture_output=True,
                            text=True, timeout=300)  # another process: the type is known from the run's config
    assert report.returncode == 0, report.stderr
    page = (run / "report.html").read_text()
    assert f"said (said_max): largest output {said.group(1)}, said by its own type" in page
    own = page.split('<section id="said"><h2>Said by its own type</h2>', 1)[1].split("</section>", 1)[0]
    assert f"own section: largest output {said.group(1)}" in own
    assert page.index('<section id="summary">') < page.index('<section id="said">')


def test_a_type_whose_module_no_longer_imports_is_answered_by_its_records_and_said(tmp_path):
    (tmp_path / "config.yaml").write_text("hooks:\n  gone:\n    type: gone_type\n    _module_: no_such_module_here\n")
    with pytest.warns(UserWarning, match=r"^hooks\.gone\._module_: cannot import 'no_such_module_here' "
                                         r"\(ModuleNotFoundError: .*\); type 'gone_type' is unknown here"):
        assert entry_types(tmp_path) == {"gone": "gone_type"}


def test_a_declared_section_goes_right_after_the_one_it_names_and_one_naming_none_is_refused():
    from hooks.specs import Section
    from runner.analysis.report import PAGE, page_order

    first, second = Section("a", "A", "m:f", after="pictures"), Section("b", "B", "m:g", after="a")
    order = list(page_order([second, first]))
    assert order[order.index("pictures") + 1:order.index("pictures") + 3] == ["a", "b"]
    assert [key for key in order if key in PAGE] == list(PAGE)
    with pytest.raises(ValueError, match=r"report sections \['c'\] follow none of the page's"):
        page_order([Section("c", "C", "m:h", after="nowhere")])
