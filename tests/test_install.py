"""The README's install line is enough for every example outside the optional integrations.

What the first line installs is read from ``pyproject.toml`` (the dependencies and those of the
extras it names, and what they depend on, as installed here). Every third-party import of the
project must come from that set, except the imports of an optional extra's own packages, which
live only in the modules of that integration; each of those extras is named in the README with
its install line; and the core examples run with every other package made unimportable.
"""
from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from docs_text import blocks, everything, page, section

ROOT = Path(__file__).resolve().parents[1]
README = page("README.md")
INSTALL = blocks(section("README.md", "Install"), "bash")[0]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FIRST_PARTY = ("common", "runner", "hooks", "examples", "hydra_plugins")
#: Where each optional extra's packages may be imported: the integration's own modules.
INTEGRATIONS = {
    "transformers": {"runner/integrations/huggingface.py", "runner/sources/hf.py", "runner/sources/models.py",
                     "common/tokenizers.py"},
    "lightning": {"runner/integrations/lightning.py"},
    "tensorboard": {"runner/analysis/tensorboard.py"},
    "loggers": {"runner/live/to_wandb.py", "runner/live/to_mlflow.py", "runner/live/to_tensorboard.py"},
}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def first_line_extras() -> set[str]:
    line = re.search(r"^pip install -e (\S+)$", INSTALL, re.M).group(1).strip("'")
    return set(re.findall(r"\[(.*)\]", line)[0].split(",")) if "[" in line else set()


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install, with what they require (unconditional ones, as installed)."""
    todo, seen = [_name(r) for r in requirements], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in needs if "extra ==" not in r]
    return seen


def third_party_imports() -> dict[str, set[str]]:
    """``{top-level module: files importing it}`` over the project's packages (function-level imports too)."""
    found: dict[str, set[str]] = {}
    for package in FIRST_PARTY:
        for file in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - set(FIRST_PARTY) - sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(file.relative_to(ROOT)))
    return found


def test_the_first_install_line_installs_the_core_and_digits_needs_no_extra():
    assert first_line_extras() == set()  # `pip install -e .`
    assert "scikit-learn" in {_name(r) for r in PROJECT["dependencies"]}  # data=digits: the training examples


def test_the_cpu_wheels_line_installs_the_newest_torch_and_torchvision_the_pins_allow():
    """Before ``pip install -e .``: PyTorch's CPU-only index, at the versions the dependencies stop at."""
    first, second = [line for line in INSTALL.splitlines() if line.strip()]
    pins = {_name(r): r.rsplit("<=", 1)[1] for r in PROJECT["dependencies"] if _name(r) in ("torch", "torchvision")}
    assert first == (f"pip install torch=={pins['torch']} torchvision=={pins['torchvision']} "
                     "--index-url https://download.pytorch.org/whl/cpu")
    assert second == "pip install -e ."


def test_every_import_outside_the_integrations_is_installed_by_the_first_line():
    installed = closure(PROJECT["dependencies"])
    extras = PROJECT["optional-dependencies"]
    distributions = metadata.packages_distributions()
    wrong = []
    for module, files in third_party_imports().items():
        names = {_name(d) for d in distributions.get(module, [module])}
        if names & installed:
            continue
        owners = [extra for extra in INTEGRATIONS if names & closure(extras[extra])]
        if not owners or not files <= set().union(*(INTEGRATIONS[e] for e in owners)):
            wrong.append((module, sorted(files), owners))
    assert wrong == []


def test_each_optional_extra_is_named_with_its_install_line():
    for extra in set(PROJECT["optional-dependencies"]) - {"test"}:
        assert re.search(rf"pip install (-e )?'(\.|hook-runner)\[{extra}\]'", README), extra


BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed by the first install line)")
sys.meta_path.insert(0, Block())
sys.argv = ["runner", *{argv!r}]
from runner.__main__ import main
main()
"""


@pytest.mark.slow  # a fresh interpreter running the example (about 30 s on two cores): the slow group runs it
def test_the_digits_training_example_runs_with_only_what_the_first_line_installs(tmp_path):
    installed = closure(PROJECT["dependencies"])
    optional = set().union(*(closure(r) for e, r in PROJECT["optional-dependencies"].items() if e != "test"))
    blocked = sorted({module for module, dists in metadata.packages_distributions().items()
                      if {_name(d) for d in dists} <= optional - installed})
    assert {"transformers", "lightning", "tensorboard"} <= set(blocked)
    command = re.search(r"python -m runner -m (model=digits_cnn .*?)hydra\.sweep\.dir", everything().replace("\\\n", " "),
                        re.S).group(1).split()
    argv = [w.replace("steps=300", "steps=2").replace("eval_every=25", "eval_every=1").replace("none,clip", "clip")
            for w in command] + [f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=blocked, argv=argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "manifest.json").is_file()
