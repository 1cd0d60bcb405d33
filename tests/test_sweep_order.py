"""A sweep reads in the order its command line wrote the values: jobs, the summary, the loaders'
categories, legends and colours; ``natural_key`` orders what has no job order (layer names, decimals in text)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib import colormaps

import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis import plots
from runner.analysis.order import natural_sorted
from runner.analysis.summary import summarize, sweep_table
from runner.cli.early import expand

ROOT = Path(__file__).resolve().parents[1]
#: The README's flagship clip sweep, on the small convnet.
README_SWEEP = ["model=convnet", "hooks=clip",
                "hooks.clip={min:-1000,max:1000},{min:-0.01,max:0.01},{min:-0.0001,max:0.0001}"]
AS_WRITTEN = ["{min:-1000,max:1000}", "{min:-0.01,max:0.01}", "{min:-0.0001,max:0.0001}"]


def _sweep(tmp_path: Path, argv: list[str]) -> Path:
    """The jobs of ``python -m runner -m ARGV``, run in-process into numbered directories as Hydra's basic sweeper does."""
    sweep = tmp_path / "sweep"
    for num, job in enumerate(expand(argv)):
        run(make_config(*job), sweep / str(num), job)
    return sweep


def test_natural_key_reads_decimals_as_numbers_and_layer_names_as_counts():
    assert natural_sorted(["1000", "0.01", "0.0001", 0.5]) == ["0.0001", "0.01", 0.5, "1000"]
    assert natural_sorted(["lr=1000", "lr=0.01", "lr=0.0001"]) == ["lr=0.0001", "lr=0.01", "lr=1000"]
    assert natural_sorted(AS_WRITTEN[::-1]) == AS_WRITTEN  # -1000 < -0.01 < -0.0001
    assert natural_sorted(["transformer.h.10", "transformer.h.2", "layer1.10", "layer1.9", "run-10", "run-2"]) == \
        ["layer1.9", "layer1.10", "run-2", "run-10", "transformer.h.2", "transformer.h.10"]
    assert natural_sorted(["/s/10", "/s/2", "/s/0"]) == ["/s/0", "/s/2", "/s/10"]


def test_the_readme_dict_sweep_reads_in_command_line_order(tmp_path):
    assert [job[-1].split("=", 1)[1] for job in expand(README_SWEEP)] == AS_WRITTEN  # job number order
    sweep = _sweep(tmp_path, README_SWEEP)
    lines = summarize(sweep).splitlines()
    assert lines[1].split() == ["hooks.clip", "loss", "clipped"]
    assert [line.split()[0] for line in lines[2:5]] == AS_WRITTEN
    stats = analysis.load_stats(sweep)
    assert list(stats["hooks.clip"].cat.categories) == AS_WRITTEN
    assert list(stats.groupby("hooks.clip", observed=True).size().index) == AS_WRITTEN
    # each summary row is its own job's: the clipped share of job N is read from job N's rows alone
    table = sweep_table(sweep)
    for num, bound in enumerate(AS_WRITTEN):
        assert table["hooks.clip"][num] == bound
        rows = stats[(stats["run_dir"] == str(sweep / str(num))) & (stats["kind"] == "clipped")]
        assert table["clipped"][num] == pytest.approx((rows.numel * (1 - rows.zero_frac)).round().sum() / rows.numel.sum())
    fig = plots.compare_runs(stats, stat="l2", kind="param_grad")
    weight = fig.axes[0]
    assert [line.get_label() for line in weight.lines] == [f"hooks.clip={value}" for value in AS_WRITTEN]
    assert [line.get_color() for line in weight.lines] == [colormaps["tab10"](i) for i in range(3)]
    assert [text.get_text() for text in fig.legends[0].get_texts()] == [f"hooks.clip={v}" for v in AS_WRITTEN]
    curves = plots.loss_curves(analysis.load_steps(sweep)).axes[0]
    assert [line.get_label() for line in curves.lines] == [f"hooks.clip={value}" for value in AS_WRITTEN]


def test_numbers_and_text_keep_the_order_written_too(tmp_path):
    """Neither numbers (0.1 before 0.001) nor text is sorted: the jobs' order is the command line's."""
    sweep = _sweep(tmp_path, ["model=convnet", "hooks=clip", "hooks.clip.min=-1", "hooks.clip.max=0.1,0.001,0.01",
                              "data=randn,ones"])
    table = sweep_table(sweep)
    assert list(zip(table["hooks.clip.max"], table["data"])) == [
        (0.1, "randn"), (0.1, "ones"), (0.001, "randn"), (0.001, "ones"), (0.01, "randn"), (0.01, "ones")]
    stats = analysis.load_stats(sweep)
    assert list(stats["data"].cat.categories) == ["randn", "ones"]
    labels = [line.get_label() for line in plots.compare_runs(stats, kind="param_grad").axes[0].lines]
    assert labels == [f"hooks.clip.max={m}, data={d}" for m in (0.1, 0.001, 0.01) for d in ("randn", "ones")]


@pytest.mark.slow
def test_the_readme_dict_sweep_prints_its_summary_in_command_line_order(tmp_path):
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "runner", "-m", *README_SWEEP, f"hydra.sweep.dir={sweep}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    printed = done.stdout[done.stdout.index(f"sweep {sweep}"):].splitlines()
    assert [line.split()[0] for line in printed[2:5]] == AS_WRITTEN
    assert [analysis.overrides_of(sweep / str(num))["hooks.clip"] for num in range(3)] == AS_WRITTEN
