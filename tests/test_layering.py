"""The house's import arrows, read with ``ast`` (every import of common/, hooks/ and runner/, inside
functions too; not under ``if TYPE_CHECKING:``): README's "How it is built", arrow by arrow. The
bottom floor (common/) stands on nothing of the project, hooks/ on common/ alone, runner/sources and
runner/store on no hooks/ module, the hook specs' room (hooks/specs/) on common/ alone and no torch, runner/analysis reads files only (nothing of runner/engine,
runner/sources or hooks/), no arrow from the engine up to the command line, and no import cycle
among the project's modules."""
from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "hooks", "runner")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or is inside (``common.errors.ConfigError`` -> ``common.errors``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in it (module level, inside functions, classes,
    ``try``/``if``); not under ``if TYPE_CHECKING:``, which runs for type checkers only."""
    targets = {_project_module(imported, modules) for imported in _imported_names(name, path)}
    return {t for t in targets if t is not None and t != name}


def _imported_names(name: str, path: Path) -> set[str]:
    """Every module (or name in a module) ``name`` imports, the project's and others', read as ``_imports`` reads."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    statements: list[ast.AST] = [ast.parse(path.read_text())]
    found: set[str] = set()
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            statements += node.orelse
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {f"{base}.{alias.name}" for alias in node.names}  # a submodule, or a name in ``base``
        statements += ast.iter_child_nodes(node)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_the_files():
    graph = import_graph()
    assert "runner.engine.plan" in graph["runner.cli.commandline"]
    assert "common.errors" in graph["runner.engine.plan"]
    assert "runner.config.compose" in graph["runner.engine.plan"]


def test_imports_inside_functions_are_read_and_type_checking_ones_are_not(tmp_path):
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py", "pkg.c": tmp_path / "c.py",
               "pkg.d": tmp_path / "d.py"}
    modules["pkg.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\nelse:\n"
                                "    import pkg.d\n\n\nclass A:\n    def f(self):\n        from pkg import c\n")
    assert _imports("pkg.a", modules["pkg.a"], modules) == {"pkg.c", "pkg.d"}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_arrow_from_the_engine_up_to_the_command_line():
    up = sorted((name, imported) for name, imports in import_graph().items() if name.startswith("runner.engine")
                for imported in imports if imported.startswith("runner.cli"))
    assert up == []


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(import_graph()) == []


def _arrows(source: str, target: str) -> list[tuple[str, str]]:
    return sorted((name, imported) for name, imports in import_graph().items() if name.startswith(f"{source}.")
                  or name == source for imported in imports if imported.split(".")[0] == target)


def test_the_bottom_floor_stands_on_nothing_of_the_project():
    """common/ (error types, the tables' and files' schema, the run-directory reader) is what both
    hooks/ and runner/ stand on: it imports neither."""
    assert {"common.errors", "common.records", "common.rundir"} <= set(import_graph())
    assert _arrows("common", "hooks") == [] and _arrows("common", "runner") == []


def test_hooks_know_nothing_of_the_runner():
    assert _arrows("hooks", "runner") == []


def _arrows_into(source: str, *targets: str) -> list[tuple[str, str]]:
    """The arrows from ``source`` (a package or module) into any of ``targets`` (packages or modules)."""
    return sorted((name, imported) for name, imports in import_graph().items()
                  if name == source or name.startswith(f"{source}.") for imported in imports
                  if any(imported == t or imported.startswith(f"{t}.") for t in targets))


def test_analysis_reads_files_only():
    """runner/analysis draws from what runs wrote: it imports nothing that builds or runs a model
    (runner/engine, runner/sources) and no hooks/ module (the files' formats are common/'s)."""
    assert _arrows_into("runner.analysis", "runner.engine", "runner.sources", "hooks") == []


def test_the_sources_import_no_hooks_module():
    assert _arrows_into("runner.sources", "hooks") == []


def test_the_store_imports_no_hooks_module():
    assert _arrows_into("runner.store", "hooks") == []


def test_the_hook_specs_room_stands_on_common_alone_and_imports_no_torch():
    """hooks/specs/ is read by the command line before torch is imported: its modules import no torch, numpy,
    pyarrow or pandas, nothing of runner/, and nothing of hooks/ outside the room (common/ is allowed)."""
    room = {name: path for name, path in _modules().items() if name == "hooks.specs" or name.startswith("hooks.specs.")}
    assert {"hooks.specs", "hooks.specs.base", "hooks.specs.gradients"} <= set(room)
    heavy = sorted((name, imported) for name, path in room.items() for imported in _imported_names(name, path)
                   if imported.split(".")[0] in ("torch", "torchvision", "numpy", "pyarrow", "pandas", "matplotlib"))
    assert heavy == []
    outside = sorted((name, imported) for name, imports in import_graph().items() if name in room
                     for imported in imports if not imported.startswith(("hooks.specs", "common.")))
    assert outside == []


#: hooks/'s rooms and the rooms each may import (besides itself and common/): kernels and formats stand
#: on nothing else of hooks/, the mechanism on the kernels and the specs, the types on every other room.
ROOM_ARROWS = {
    "hooks.specs": set(),
    "hooks.kernels": set(),
    "hooks.formats": set(),
    "hooks.mechanism": {"hooks.kernels", "hooks.specs"},
    "hooks.types": {"hooks.mechanism", "hooks.kernels", "hooks.formats", "hooks.specs"},
}


def _room(module: str) -> str | None:
    return next((room for room in ROOM_ARROWS if module == room or module.startswith(f"{room}.")), None)


def test_every_hooks_module_lives_in_a_room():
    """hooks/ holds its package opening and the rooms, nothing else: a newcomer knows where a file goes."""
    loose = sorted(name for name in _modules() if name.startswith("hooks.") and _room(name) is None)
    assert loose == []


def test_hooks_rooms_import_only_the_rooms_below_them():
    wrong = sorted((name, imported) for name, imports in import_graph().items() if _room(name)
                   for imported in imports if imported.startswith("hooks.") and _room(imported) != _room(name)
                   and _room(imported) not in ROOM_ARROWS[_room(name)])
    assert wrong == []


def test_analysis_and_sources_reach_files_through_the_bottom_floor_only():
    """What a run wrote (manifest, claim, ranks' parts, sweep record, statuses, config) is read through
    common/, never through the writer's modules in runner/store."""
    assert _arrows_into("runner.analysis", "runner.store") == []
    assert _arrows_into("runner.sources", "runner.store") == []


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, pending = set(), [start]
    while pending:
        for imported in graph.get(pending.pop(), ()):
            if imported not in seen:
                seen.add(imported)
                pending.append(imported)
    return seen


def test_the_loop_stands_on_the_plan_and_not_the_other_way():
    """``runner.engine.loop`` runs a compiled ``Plan``; the plan (the gate) imports nothing of the loop,
    directly or through another module."""
    graph = import_graph()
    assert "runner.engine.plan" in graph["runner.engine.loop"]
    assert "runner.engine.loop" not in _reaches(graph, "runner.engine.plan")


def test_the_reach_finder_follows_imports_through_other_modules():
    assert _reaches({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"b", "c"}
