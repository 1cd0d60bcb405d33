"""The attribution-graphs tutorial (``docs/tutorials/attribution-graphs.md``): its commands run as written from a
directory like the repository root, and give what the page says: the answer lines it shows, the node counts, the
picture it embeds (the same pixels as the run draws), what its Python prints, a sweep whose merged tables are its
jobs' own, and the error line of its mistake, with status 2 and nothing written."""
from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import run_main
from docs_text import blocks, section
from picture_content import pixels
from runner.analysis.graph import load_graphs
from runner.analysis.load import run_dirs
from test_graph_cli import without_job_columns

pytestmark = pytest.mark.statistics

pytest.importorskip("transformers")

PAGE = "tutorials/attribution-graphs.md"
ROOT = Path(__file__).resolve().parents[1]


def command(heading: str, index: int = 0) -> list[str]:
    return shlex.split(blocks(section(PAGE, heading), "bash")[index].replace("\\\n", " "))[3:]


def test_the_page_s_commands_run_as_written_and_give_what_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    units = run_main(monkeypatch, capsys, *command("The transcoders' features and their top prompts"))
    assert units.code == 0, units.stderr

    graph = run_main(monkeypatch, capsys, *command("The graph of each prompt"))
    assert graph.code == 0, graph.stderr
    shown, = blocks(section(PAGE, "The graph of each prompt"), "text")
    printed = graph.stdout.splitlines()
    for line in shown.strip("\n").splitlines():
        assert line in printed, line
    nodes, edges = load_graphs("runs/graph")
    first = nodes[nodes["sample"] == 0]
    assert first.kind.value_counts().to_dict() == {"feature": 42, "error": 12, "logit": 10, "embedding": 6}
    assert sorted(set(first.position[first.kind == "feature"])) == [1, 2, 3, 4, 5]
    drawn = pixels(Path("runs/graph/attribution_graph.png"))
    asset = pixels(ROOT / "docs/assets/attribution_graph_gpt2_tiny.png")
    assert drawn.shape == asset.shape and np.abs(drawn - asset).max() < 0.05

    code, = blocks(section(PAGE, "The tables"), "python")
    said = section(PAGE, "The tables").split("prints `", 1)[1].split("`", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, PAGE, "exec"), {})
    assert out.getvalue().strip() == said

    sweep = run_main(monkeypatch, capsys, *command("A sweep over prompts"))
    assert sweep.code == 0, sweep.stderr
    jobs = run_dirs("runs/graph_sweep")
    for merged, *own in zip(load_graphs("runs/graph_sweep"), *(load_graphs(job) for job in jobs)):
        assert sorted(set(merged["sample"])) == [0, 1, 2, 3]
        pd.testing.assert_frame_equal(without_job_columns(merged), without_job_columns(pd.concat(own)))

    before = set(Path("runs").iterdir())
    mistake = run_main(monkeypatch, capsys, *command("The graph of each prompt")[:-1],
                       "hooks.transcoder.layers=blocks.0.mlp", "hydra.run.dir=runs/mistake")
    line, = blocks(section(PAGE, "Mistakes are one line"), "text")
    assert (mistake.code, mistake.stderr.strip()) == (2, line.strip())
    assert set(Path("runs").iterdir()) == before

