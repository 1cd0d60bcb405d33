"""A sweep's summary: its headline statistic is the one that differs most between its jobs (never a
column the same in every job), a swept ``loss=`` keeps its column beside the recorded loss, and the
report's summary table lists the jobs in the order of the pictures below it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis.report import render
from runner.analysis.summary import spread, summarize, sweep_table
from runner.cli.early import expand

pytestmark = pytest.mark.statistics


def sweep_of(tmp_path: Path, argv: list[str]) -> Path:
    """The jobs of ``python -m runner -m ARGV``, in-process into numbered directories as Hydra's basic sweeper does."""
    for num, job in enumerate(expand(argv)):
        run(make_config(*job), tmp_path / "sweep" / str(num), job)
    return tmp_path / "sweep"


def largest_l2(sweep: Path, kind: str) -> np.ndarray:
    """Per job (by hand from its stats.parquet): the largest of its tensors' mean l2 of ``kind``."""
    out = []
    for job in sorted(sweep.iterdir(), key=lambda p: int(p.name)):
        stats = pq.read_table(job / "stats.parquet").to_pandas()
        out.append(stats[stats.kind == kind].groupby(["layer", "slot", "call"]).l2.mean().max())
    return np.array(out)


def test_a_seed_sweep_s_headline_differs_between_its_jobs_and_the_constant_one_is_a_line(tmp_path):
    """With ``loss=sum`` the gradient at the convnet's 5 outputs is 1 each: the largest grad_output l2 is sqrt(5)
    in every job, so it is said once, and the output norm, which the seed changes, is the headline."""
    sweep = sweep_of(tmp_path, ["model=convnet", "hooks=stats", "loss=sum", "seed=range(0,3)"])
    grads, outputs = largest_l2(sweep, "grad_output"), largest_l2(sweep, "output")
    assert np.allclose(grads, np.sqrt(5)) and spread(outputs) > 0
    table = sweep_table(sweep)
    assert list(table.columns) == ["seed", "loss", "largest output l2"]
    assert np.array_equal(table["largest output l2"].to_numpy(), outputs)
    lines = summarize(sweep).splitlines()
    assert lines[-2] == f"  the same in every job: largest grad_output l2 {grads[0]:.4g}"
    assert [line.split()[0] for line in lines[2:5]] == ["0", "1", "2"]


def test_a_sweep_over_loss_keeps_the_swept_names_beside_the_recorded_losses(tmp_path):
    sweep = sweep_of(tmp_path, ["model=convnet", "hooks=stats", "loss=sum,mean"])
    steps = analysis.load_steps(sweep)
    assert list(steps["override.loss"]) == ["sum", "mean"] and steps.attrs["overrides"] == ["model", "hooks", "override.loss"]
    recorded = [pq.read_table(sweep / str(num) / "steps.parquet").column("loss").to_pylist()[-1] for num in (0, 1)]
    assert list(steps["loss"]) == recorded and recorded[0] != recorded[1]
    assert "override.loss" in analysis.load_stats(sweep).columns  # the same column in every loader
    table = sweep_table(sweep)
    assert list(table["override.loss"]) == ["sum", "mean"] and list(table["loss"]) == recorded


def test_the_report_s_summary_table_and_pictures_list_the_jobs_in_the_same_order(tmp_path, monkeypatch):
    """A Hydra multirun (its sweep.json in job order) over learning rates written largest first."""
    from runner.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["runner", "-m", "model=convnet", "hooks=stats", "optimizer=sgd", "steps=2",
                                      "optimizer.lr=0.1,0.01,0.003", "hydra.sweep.dir=sweep", "progress=false"])
    main()
    page = render(tmp_path / "sweep")
    summary = re.search(r'<pre class="summary">(.*?)</pre>', page, re.S).group(1).splitlines()
    assert [line.split()[0] for line in summary[2:5]] == ["0.1", "0.01", "0.003"]
    assert re.findall(r"<h3>\d+: optimizer.lr=([\d.]+)</h3>", page) == ["0.1", "0.01", "0.003"]
