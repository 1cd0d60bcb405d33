"""The units tutorial (docs/tutorials/units.md) and "Whole datasets and stores" (docs/how-to/whole-datasets.md):
every command and code block runs as written, the tutorial's first.

Each ``python -m runner ...`` line runs in-process (the config check and plan of the CLI) from a
temporary working directory, into the directory its ``hydra.run.dir`` names; the Slurm sweep's
overrides run here as the four jobs the basic launcher would run (``data.shard`` expanded,
``hydra/launcher`` dropped), and as written on the one-node cluster in the ``slurm`` group. The
Python blocks run in the same directory, after the commands before them. The torchrun workflow
runs as written in the ``torchrun`` group.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_config, run
from docs_text import page
from slurm_cluster import ENV, slurm  # noqa: F401  (the one-node cluster fixture)

pytestmark = pytest.mark.docs_runs

ROOT = Path(__file__).resolve().parents[1]
#: The tutorial (the units pass, its picture, the probe), then the how-to (the sharded sweep, the ranks).
SECTION = page("tutorials/units.md") + page("how-to/whole-datasets.md")


def blocks(language: str) -> list[str]:
    return [part.split("```", 1)[0] for part in SECTION.split(f"```{language}\n")[1:]]


def commands(block: str) -> list[list[str]]:
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def run_command(words: list[str]) -> None:
    """One command line of the pages, in-process."""
    if words[:2] == ["python", "assets/make_crops.py"]:
        subprocess.run([sys.executable, str(ROOT / words[1]), *words[2:]], check=True)
        return
    assert words[:3] == ["python", "-m", "runner"], words
    overrides = words[3:]
    if overrides[0] == "-m":  # the sweep: its jobs, as the basic launcher runs them
        sweep = Path(next(w for w in overrides if w.startswith("hydra.sweep.dir=")).split("=", 1)[1])
        kept = [w for w in overrides[1:] if not w.startswith(("hydra/launcher=", "hydra.launcher.", "hydra.sweep.",
                                                                "data.shard="))]
        assert "data.shard=range(0,4)" in overrides
        for shard in range(4):
            job = [*kept, f"data.shard={shard}"]
            run(make_config(*job), sweep / str(shard), job)
        return
    out = Path(next(w for w in overrides if w.startswith("hydra.run.dir=")).split("=", 1)[1])
    kept = [w for w in overrides if not w.startswith("hydra.")]
    run(make_config(*kept), out, kept)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """A working directory like the repository root the docs' commands run from: it has ``assets/``."""
    (tmp_path / "assets").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_three_workflows_run_as_written(in_tmp, capsys):
    bash, python = blocks("bash"), blocks("python")
    # the fourth command block and code blocks 4 and 5: torchrun; the sixth: names in your own loop (test_units_answer.py)
    assert len(bash) == 4 and len(python) == 6
    for block, code in zip(bash[:3], python[:3]):
        for words in commands(block):
            run_command(words)
        exec(compile(code, "docs/tutorials/units.md", "exec"), {})
    printed = capsys.readouterr().out
    accuracy = float(printed.split("probe accuracy on layer3: ")[1].split()[0])
    assert accuracy >= 0.9  # top and bottom crops of the house are linearly apart in layer3
    assert (in_tmp / "outputs" / "units_top_layer3.png").stat().st_size > 10_000
    assert (in_tmp / "outputs" / "units_layers.png").stat().st_size > 10_000
    assert not any((in_tmp / "assets").iterdir())  # the tutorial writes into no tracked folder
    assert (in_tmp / "outputs" / "stores" / "crops" / "layer3" / "shard-00002.safetensors").is_file()
    from runner.analysis import report

    command = shlex.split(SECTION.split("(`python -m runner.report ", 1)[1].split("`", 1)[0])
    assert command == ["outputs/units"]
    report.main(command)  # what python -m runner.report runs
    page = (in_tmp / command[0] / "report.html").read_text()
    section = page.split('<section id="units"><h2>Unit statistics</h2>', 1)[1].split("</section>", 1)[0]
    assert "<td>layer3</td>" in section and "<td>layer4</td>" in section
    drawn = re.findall(r'<img alt="top samples of (layer[34]) unit \d+"', section)
    assert drawn == ["layer3"] * 3 + ["layer4"] * 3  # as the sentence says: the 3 units the answer names, each layer


@pytest.mark.slurm
def test_the_sharded_sweep_runs_as_written_on_slurm(slurm, tmp_path):
    subprocess.run([sys.executable, str(ROOT / "assets/make_crops.py"), "outputs/crops"], cwd=tmp_path, check=True)
    (sweep,) = commands(blocks("bash")[2])
    proc = subprocess.run(shlex.join(sweep), shell=True, cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    from runner.analysis.units import load_units

    merged = load_units(tmp_path / "outputs" / "units_sweep")
    assert (merged[merged.layer == "layer3"]["count"] == 192 * 4 * 4).all()  # 192 crops, 4x4 positions each


@pytest.mark.torchrun
def test_units_and_a_store_under_torchrun_merge_to_the_one_process_run(tmp_path, monkeypatch):
    from common.records import UNITS
    from runner.analysis.units import load_units
    from runner.store.activations import ActivationStore, ShuffledStore
    from common.ranks import rank_files

    (tmp_path / "units_ranks.py").write_text(blocks("python")[3])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for words in commands(blocks("bash")[3]):
        words = [sys.executable, *words[1:]] if words[0] == "python" else words
        done = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks("python")[4], "docs/how-to/whole-datasets.md", "exec"), {})

    parts = [pq_frame(path) for _, path in rank_files(tmp_path / "runs" / "ranks", UNITS)]
    assert [sorted(set(p["count"][p.layer == "3"])) for p in parts] == [[896], [896]]  # each rank its half
    ranks, one = load_units(tmp_path / "runs" / "ranks"), load_units(tmp_path / "runs" / "one")
    assert len(ranks) == len(one) == 8 + 10 and (one["count"][one.layer == "3"] == 1792).all()
    exact = ["hook", "layer", "call", "unit", "count", "min", "max", "above", "sketch_index", "sketch_count",
             "top_value", "top_sample", "top_position", "bottom_value", "bottom_sample", "bottom_position"]
    for column in exact:
        assert all(np.array_equal(a, b) for a, b in zip(ranks[column], one[column])), column
    for column in ("mean", "m2", "second_moment"):
        for a, b in zip(ranks[column], one[column]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())

    assert sorted(p.name for p in (tmp_path / "outputs" / "stores" / "ranks" / "3").iterdir()) == ["rank-0", "rank-1"]
    store = ActivationStore(tmp_path / "outputs" / "stores" / "ranks" / "3")
    alone = ActivationStore(tmp_path / "outputs" / "stores" / "one" / "3")
    assert len(store) == len(alone) == 1792
    rows = [store[i] for i in range(len(store))]
    assert [sample for _, sample in rows] == list(range(1792))
    assert torch.equal(torch.stack([x for x, _ in rows]), torch.stack([alone[i][0] for i in range(1792)]))
    assert sorted(sample for _, sample in ShuffledStore(tmp_path / "outputs" / "stores" / "ranks" / "3")) == list(range(1792))


def pq_frame(path: Path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()
