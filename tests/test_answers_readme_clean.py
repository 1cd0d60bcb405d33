"""The README's commands leave the checkout as they found it: what they write goes where git ignores it
(``outputs/``, ``runs/``), never beside the tracked files.

Fast: every path a README command or code block names as an output (run and sweep directories, the
crops folder, stores, offload folders, an MLflow database, saved pictures) is one git ignores. Slow:
the README's commands that write most run in a fresh clone of this checkout, and ``git status`` is
empty after them."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from docs_text import blocks as docs_blocks, everything, page

ROOT = Path(__file__).resolve().parents[1]
README = everything()  # README.md and the docs pages
#: Where a README command names what it writes.
WRITTEN = [r"\bhydra\.(?:run|sweep)\.dir=([^\s'`]+)", r"\breplay\.out=([^\s'`]+)", r"\bhooks\.store\.path=([^\s'`]+)",
           r"\bmodel\.offload_folder=([^\s'`]+)", r"sqlite:///([^\s'`]+)", r"make_crops\.py ([^\s'`]+)",
           r"\bout_dir=f?\"([^\"]+)\"", r"\"path\": f?\"([^\"]+)\""]


def saved_pictures(text: str) -> list[str]:
    """The file of every ``save_png(FIGURE, "FILE")`` call (its last quoted argument)."""
    found = []
    for start in (m.end() for m in re.finditer(r"save_png\(", text)):
        depth, end = 1, start
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found += re.findall(r"\"([^\"]+)\"", text[start:end])[-1:]  # none in prose: save_png(fig, path)
    return found


def written_paths() -> list[str]:
    paths = [m.group(1) for pattern in WRITTEN for m in re.finditer(pattern, README)] + saved_pictures(README)
    return sorted({re.sub(r"\$?\{[^}]*\}", "x", path) for path in paths if not path.isupper()})  # DIR: a placeholder in prose


def test_every_path_a_readme_command_writes_is_one_git_ignores():
    paths = written_paths()
    assert {"outputs/crops", "outputs/mlflow.db", "outputs/clip_sweep.png", "outputs/stores/crops"} <= set(paths)
    checked = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-v", "-n"], cwd=ROOT, text=True,
                             input="\n".join(paths) + "\n", capture_output=True)
    not_ignored = [line.split("\t")[1] for line in checked.stdout.splitlines() if line.startswith("::")]
    assert not_ignored == []


def blocks(name: str, language: str) -> list[str]:
    """The ``language`` code blocks of docs page ``name``."""
    return docs_blocks(page(name), language)


@pytest.mark.slow  # resnet18 over 192 crops twice, a 3-job resnet18 sweep, a gpt2_tiny run: a few minutes
def test_the_readme_s_commands_leave_a_clean_clone_clean(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    whole = blocks("tutorials/units.md", "bash")[:2], blocks("tutorials/units.md", "python")[:2]
    clip = ([blocks("tutorials/clip.md", "bash")[0]],
            [blocks("tutorials/clip.md", "python")[0]])
    lens = ([blocks("tutorials/steering.md", "bash")[1]], [])
    for bash, python in (whole, clip, lens):
        for block in bash:
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip():
                    words = shlex.split(line, comments=True)
                    done = subprocess.run([sys.executable, *words[1:]], cwd=clone, env=env, capture_output=True,
                                          text=True)
                    assert done.returncode == 0, done.stderr[-2000:]
        for code in python:
            done = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
    assert (clone / "outputs" / "crops").is_dir() and (clone / "outputs" / "clip_sweep.png").is_file()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == ""
