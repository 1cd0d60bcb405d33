"""The tutorial table (docs/tutorials/classic-hooks.md) is a test: every command line in it runs as written.

Each ``python -m runner ...`` in a row of the table is split as a shell would split it
(``shlex.split``), ``python -m runner`` is dropped, and the overrides run in-process (the
``run_with`` fixture: the same config check and plan as the CLI). What a row claims in numbers is
tested against hand-written PyTorch in ``tests/test_tutorials.py`` and ``tests/test_seeds.py``;
here a few claims the table words in its own way are checked on the run itself.
"""
from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import pytest

import runner.analysis as analysis
from docs_text import blocks, section
from examples import seed_hooks

ROOT = Path(__file__).resolve().parents[1]

#: Resnets at the table's default input (batch 10, 224x224) take seconds each on a CPU; the rows
#: with a resnet (named, or the default resnet18) run here at batch 1, 64x64, appended last so it
#: wins. The hooks, layers and kinds are the same; only the sizes shrink.
SMALL_RESNET_INPUT = "data.shape=[1,3,64,64]"


def tutorial_rows() -> list[str]:
    """The rows of the tutorial table (header excluded)."""
    table = section("tutorials/classic-hooks.md", "The classic hook tutorials, one command each")
    rows = [line for line in table.splitlines() if line.startswith("|")]
    return rows[2:]  # the header and the |---| line


def commands_of(row: str) -> list[str]:
    """Every ``python -m runner ...`` code span of a row, from ``python`` on (an env prefix stays out)."""
    spans = re.findall(r"`([^`]*python -m runner [^`]*)`", row)
    return [span[span.index("python -m runner"):] for span in spans]


COMMANDS = [command for row in tutorial_rows() for command in commands_of(row)]


def overrides_of(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "runner"], command
    overrides = words[3:]
    model = next((w.split("=", 1)[1] for w in overrides if w.startswith("model=")), "resnet18")
    if model.startswith("resnet"):
        overrides.append(SMALL_RESNET_INPUT)
    return overrides


def test_every_row_of_the_tutorial_table_has_a_command_line():
    rows = tutorial_rows()
    assert len(rows) >= 20
    assert [row for row in rows if not commands_of(row)] == []


@pytest.mark.parametrize("command", COMMANDS, ids=[c[len("python -m runner "):] for c in COMMANDS])
def test_tutorial_command_runs_as_written(run_with, command):
    seed_hooks.STORAGE.clear()
    run_dir = run_with(*overrides_of(command))
    seed_hooks.STORAGE.clear()
    assert (run_dir / "manifest.json").exists() and (run_dir / "stats.parquet").exists()
    assert len(analysis.load_stats(run_dir)) > 0


def test_log_mean_clip_row_gives_a_nan_loss_and_clipped_finite_gradients(run_with):
    """The row says: the loss is NaN (log of negative logits), every param_grad within ±0.01."""
    command = next(c for c in COMMANDS if "loss=log_mean hooks=clip" in c)
    with pytest.warns(Warning, match="the loss is nan"):
        run_dir = run_with(*overrides_of(command))
    assert math.isnan(analysis.load_steps(run_dir).loss.iloc[0])
    grads = analysis.load_stats(run_dir, filters=[("kind", "=", "param_grad")])
    assert len(grads) > 0 and (grads.nan_count == 0).all() and (grads.inf_count == 0).all()
    assert grads["min"].min() >= -0.01 * (1 + 1e-7) and grads["max"].max() <= 0.01 * (1 + 1e-7)


def test_zero_bias_row_before_and_after(run_with):
    """The row's recording entry shows fc.bias's gradient before the hook (-1/5 each: one_minus_mean
    of 5 outputs), and hooks=zero_bias makes it 0."""
    zero, before = (c for c in COMMANDS if "loss=one_minus_mean" in c)
    bias = dict(layer="fc", slot="bias", kind="param_grad")
    rows = analysis.load_stats(run_with(*overrides_of(before)))
    row = rows[(rows.layer == bias["layer"]) & (rows.slot == bias["slot"]) & (rows.kind == bias["kind"])]
    assert len(row) == 1 and row["min"].item() == row["max"].item() == pytest.approx(-1 / 5)
    rows = analysis.load_stats(run_with(*overrides_of(zero)))
    row = rows[(rows.layer == bias["layer"]) & (rows.slot == bias["slot"]) & (rows.kind == bias["kind"])]
    assert set(row.phase) == {"backward", "after_backward"} and (row.l2 == 0).all()


def test_max_calls_row_prints_once_and_records_step_0_only(run_with, capsys):
    command = next(c for c in COMMANDS if "max_calls=1" in c)
    rows = analysis.load_stats(run_with(*overrides_of(command)))
    assert capsys.readouterr().out.count("layer: Linear(in_features=100, out_features=200, bias=True)") == 1
    assert list(rows.step) == [0] and list(rows.kind) == ["output"]


def test_the_own_loop_example_runs_as_written(tmp_path, monkeypatch):
    """The ``runner.attach`` snippet of "Your own loop", executed as it stands, writes a run the loaders read."""
    code = blocks(section("how-to/own-model.md", "Your own loop"), "python")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/how-to/own-model.md (Your own loop)", "exec"), {})
    steps = analysis.load_steps(tmp_path / "runs" / "mine")
    assert len(steps) == 2 * 29 and steps.accuracy.between(0, 1).all()  # 1,797 digits in batches of 64, 2 epochs
    stats = analysis.load_stats(tmp_path / "runs" / "mine")
    assert (stats[stats.kind == "param_grad"]["max"] <= 0.1 * (1 + 1e-7)).all()


def test_ci_runs_exactly_the_readmes_test_commands():
    """``.ci/run`` runs the README's test commands and nothing cleverer: the pytest and mkdocs lines of the
    README's "Tests" block are those of ``.ci/run``, in the same order."""
    (tests,) = blocks(section("README.md", "Tests"), "bash")
    readme = [re.search(r"(python -m pytest|mkdocs build)[^#&]*", line).group(0).strip()
              for line in tests.splitlines() if re.search(r"python -m pytest|mkdocs build", line)]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith(("python -m pytest", "mkdocs build"))]
    assert len(readme) == 8 and readme == ci


def test_the_output_schema_names_every_column_of_units_parquet():
    from common.records import UNITS_SCHEMA

    schema = section("reference/output-schema.md", "Output schema")
    paragraph = schema.split("`units.parquet` exists only", 1)[1].split("\n\n", 1)[0]
    assert [name for name in UNITS_SCHEMA.names if f"`{name}`" not in paragraph] == ["hook", "layer", "call", "unit"]
