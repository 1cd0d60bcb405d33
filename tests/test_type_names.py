"""No module of runner/ (engine, analysis, command line, report, pictures, live loggers) tests a hook type's name:
what a type means to them (its answer, its report section, what generation needs of it, whether a live logger
shows its rows) is declared by the type with its spec (``hooks/specs/``: ``HookSpec.answers``, ``section``,
``stored_run``, ``without_side_pass``, ``logged_live``) and asked of it, so a type added in its own module is
answered and reported with no runner file touched.

Read with ``ast``: a string constant equal to a registered type's name (``HOOK_TYPES``) as an operand of a
comparison (``==``, ``!=``, ``in``, ``<=``, ..., also as an item of a tuple, list or set operand), as a key of a
dict literal, or as a value in a ``match`` case is a test of that name. A type's name elsewhere (a docstring, an
error message, a column read by name) is not."""
from __future__ import annotations

import ast
from pathlib import Path

from hooks.specs import HOOK_TYPES

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
