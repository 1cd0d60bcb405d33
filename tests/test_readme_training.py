"""The training example ("Training with a clip bound", docs/tutorials/clip.md): the sweep as written, its table, picture and claims.

The command's two jobs run in-process (the same config check and plan as the CLI) into the sweep
directory it names, each with its own overrides as Hydra's multirun gives them; then the README's
Python snippet runs as written on them, and what the README says of the result is checked on it.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import runner.analysis as analysis
from conftest import make_config, run
from docs_text import everything, section

ROOT = Path(__file__).resolve().parents[1]
TEXT = everything()
SECTION = section("tutorials/clip.md", "Training with a clip bound")
#: The section's code blocks: the command, the Python snippet, and the table the snippet prints.
COMMAND, SNIPPET, TABLE = (code for _, code in re.findall(r"```(\w*)\n(.*?)```", SECTION, re.S))


def _jobs() -> list[list[str]]:
    """Each job's overrides, as ``python -m runner -m ...`` expands the one sweep list it holds."""
    words = shlex.split(COMMAND.replace("\\\n", " "))  # a backslash-newline continues the line, as in a shell
    assert words[:4] == ["python", "-m", "runner", "-m"]
    overrides = [w for w in words[4:] if not w.startswith("hydra.")]
    swept = next(i for i, w in enumerate(overrides) if "," in w)
    key, values = overrides[swept].split("=", 1)
    return [overrides[:swept] + [f"{key}={value}"] + overrides[swept + 1:] for value in values.split(",")]


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+\.\d+", text)]


@pytest.mark.slow  # 600 training steps as written (40-80 s on two cores): the slow group runs it
def test_the_training_example_runs_as_written_and_shows_what_the_readme_says(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / re.search(r"hydra\.sweep\.dir=(\S+)", COMMAND).group(1)
    for num, overrides in enumerate(_jobs()):
        run(make_config(*overrides), sweep / str(num), overrides)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(SNIPPET, "docs/tutorials/clip.md (Training with a clip bound)", "exec"), {})
    printed = capsys.readouterr().out

    # the table is the snippet's output, to the 2 decimals it prints
    assert printed.split("\n", 3)[:3] == TABLE.split("\n", 3)[:3]  # the header lines
    np.testing.assert_allclose(_numbers(printed), _numbers(TABLE), atol=0.005 + 1e-9)
    # the picture is the snippet's: the same pixels but for a few antialiased edge pixels one level off
    # (float rounding of the losses differs across BLAS builds; a changed curve moves thousands)
    drawn = np.asarray(Image.open(tmp_path / "outputs" / "training_clip_digits.png")).astype(int)
    shown = np.asarray(Image.open(ROOT / "assets" / "training_clip_digits.png")).astype(int)
    assert drawn.shape == shown.shape
    off = np.abs(drawn - shown)
    assert off.max() <= 2 and np.count_nonzero(off) <= 100, (off.max(), np.count_nonzero(off))

    steps = analysis.load_steps(sweep)
    held = steps[steps.split == "eval"].pivot(index="step", columns="hooks", values=["loss", "accuracy"])
    assert list(held.index) == list(range(24, 300, 25))
    loss, accuracy = held["loss"], held["accuracy"]
    assert accuracy["none"].iloc[-1] > 0.9 and accuracy["clip"].iloc[-1] > 0.8  # chance is 0.1
    assert (loss["clip"] > loss["none"]).all()                              # "higher at every eval"
    but = re.search(r"lower at all evals but those after\s+steps (\d+) and\s+(\d+)", SECTION)
    assert list(accuracy.index[accuracy["clip"] >= accuracy["none"]]) == [int(n) for n in but.groups()]
    said = re.search(r"\((\d+\.\d+) against (\d+\.\d+) after 300\s+steps, halfway (\d+\.\d+) against "
                     r"(\d+\.\d+)\)", SECTION)
    assert [float(n) for n in said.groups()] == [round(loss.loc[299, "clip"], 2), round(loss.loc[299, "none"], 2),
                                                round(loss.loc[149, "clip"], 2), round(loss.loc[149, "none"], 2)]
    ends = re.search(r"ends at\s+(\d+\.\d+) against (\d+\.\d+)", SECTION)
    bullet = re.search(r"held-out accuracy of (\d+\.\d+) \(chance:\s+0.10\), (\d+\.\d+) with `hooks=clip`", TEXT)
    final = [round(accuracy.loc[299, "clip"], 2), round(accuracy.loc[299, "none"], 2)]
    assert [float(n) for n in ends.groups()] == final == [float(n) for n in reversed(bullet.groups())]

    # "clamps every element of every parameter's gradient to [-0.01, 0.01]"
    grads = analysis.load_stats(sweep / "1", filters=[("kind", "=", "param_grad")])
    assert len(grads) and grads["max"].max() <= 0.01 and grads["min"].min() >= -0.01
    assert set(grads.step) == set(range(300))
