"""Which files are the project's code, for the tests that count or watch calls into it: the files of the
packages ``pyproject.toml``'s ``packages.find`` includes (``common``, ``runner``, ...), where Python finds
them. Not "every file under the repository root": a venv inside the clone (``.venv``, ``venv``) puts
torch there too, and the counts would take torch's calls for ours."""
from __future__ import annotations

import functools
import importlib.util
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The top-level packages pip installs (``common*`` -> ``common``), read from pyproject.toml.
PACKAGES = tuple(pattern.split(".")[0].rstrip("*") for pattern in tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"])
#: ``{directory of a package, as imported: the directory that holds it}``
_HOMES = {Path(location).resolve(): Path(location).resolve().parent
          for package in PACKAGES for location in importlib.util.find_spec(package).submodule_search_locations}


@functools.lru_cache(maxsize=None)
def project_file(filename: str) -> str | None:
    """``filename`` (a code object's ``co_filename``) relative to its checkout (``runner/engine/loop.py``)
    when it is a file of the project's packages, else ``None`` (torch, the tests, ``<string>``)."""
    path = Path(os.path.realpath(filename))
    for home, checkout in _HOMES.items():
        if path.is_relative_to(home):
            return str(path.relative_to(checkout))
    return None
