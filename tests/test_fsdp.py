"""FSDP2 (``fully_shard``, two CPU ranks on gloo, under torchrun): every hook type runs on sharded
parameters and gradients or is refused in one line, and gives the numbers and the trained weights of
the same run unsharded in one process (``fsdp_cases``). Marker group ``torchrun``:
``python -m pytest -q -m torchrun``."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fsdp_cases
import runner
import runner.analysis as analysis
from conftest import docs_block
from runner.analysis.summary import summarize_run
from docs_text import page

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parents[1]
IDS = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
STATS = ["mean", "std", "min", "max", "abs_mean", "l2", "zero_frac"]


def extract_source(kind: str, out: Path) -> Path:
    """An unsharded run that kept the middle layer's outputs on every step's whole batch (``patch``'s source)."""
    model = fsdp_cases.build(kind)
    keep = {"keep": {"type": "capture", "layers": fsdp_cases.MIDDLE[kind], "kinds": ["output"]}}
    with runner.attach(model, hooks=keep, out_dir=out) as run:
        for step in range(fsdp_cases.STEPS):
            with torch.no_grad():
                fsdp_cases.loss_of(model, kind, *fsdp_cases.batch(kind, step, None))
            run.step()
    return out


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """Every case and preset run once under ``torchrun --nproc_per_node=2`` (one launch for all)."""
    out = tmp_path_factory.mktemp("fsdp")
    sources = [str(extract_source(kind, out / f"source-{kind}")) for kind in ("mlp", "gpt")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               str(ROOT / "tests" / "fsdp_worker.py"), str(out), *sources]
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def rows(stats):
    return stats.sort_values(IDS).reset_index(drop=True)


@pytest.mark.parametrize("kind,case", fsdp_cases.CASES, ids=[f"{k}-{c}" for k, c in fsdp_cases.CASES])
def test_a_sharded_run_gives_the_numbers_and_weights_of_the_unsharded_run(sharded_runs, tmp_path, kind, case):
    source = str(sharded_runs / f"source-{kind}")
    model = fsdp_cases.build(kind)
    fsdp_cases.train(model, kind, case, tmp_path / "whole", None, source)
    whole = rows(analysis.load_stats(tmp_path / "whole"))
    stats = analysis.load_stats(sharded_runs / f"{kind}-{case}")
    assert sorted(set(stats["rank"])) == [0, 1]
    assert len(whole) > 0
    for rank in (0, 1):
        mine = rows(stats[stats["rank"] == rank])
        assert mine[IDS].values.tolist() == whole[IDS].values.tolist()  # the same rows, none missing
        assert mine["tensor_shape"].map(list).tolist() == whole["tensor_shape"].map(list).tolist()
        np.testing.assert_allclose(mine[STATS].to_numpy(float), whole[STATS].to_numpy(float), rtol=2e-4, atol=1e-6)
    trained = torch.load(sharded_runs / f"{kind}-{case}.pt")
    for name, p in model.named_parameters():
        torch.testing.assert_close(trained[name], p.detach(), rtol=1e-4, atol=1e-6)


def test_every_preset_runs_or_is_refused_in_one_line_on_both_ranks(sharded_runs):
    outcomes = [json.loads((sharded_runs / f"presets-{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes[0] == outcomes[1]
    presets = {p.stem for p in (ROOT / "conf" / "hooks").glob("*.yaml")}
    assert set(outcomes[0]) == presets
    for preset, outcome in outcomes[0].items():
        assert outcome == "ok" or (outcome.startswith("refused: ") and "\n" not in outcome), (preset, outcome)
    for preset in ("clip", "zero_bias", "post_accumulate", "stats", "patch", "ablate", "extract"):
        assert outcomes[0][preset] == "ok", (preset, outcomes[0][preset])


def test_the_readme_fsdp_example_runs_as_written_on_two_ranks(tmp_path):
    (tmp_path / "train_fsdp.py").write_text(docs_block("how-to/big-models.md", "Big models", "python"))
    command = "torchrun --nproc_per_node=2 train_fsdp.py"
    assert f"`{command}`" in page("how-to/big-models.md")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = analysis.load_stats(tmp_path / "runs" / "fsdp")
    grads = stats[stats.kind == "param_grad"]
    assert sorted(set(stats["rank"])) == [0, 1] and len(grads) > 0
    assert (grads["max"] <= 0.01 + 1e-9).all() and (grads["min"] >= -0.01 - 1e-9).all()  # clip's bounds, whole tensors
    assert {tuple(shape) for shape in grads.tensor_shape} == {(16, 8), (16,), (3, 16), (3,)}
    # Every rank records each gradient's whole row: the summary counts it once, as one unsharded process does.
    clip_line = [line for line in summarize_run(readme_loop_unsharded(tmp_path / "whole")) if "clipped" in line]
    assert len(clip_line) == 1 and clip_line[0] in summarize_run(tmp_path / "runs" / "fsdp")


def readme_loop_unsharded(out: Path) -> Path:
    """The README's FSDP2 example in one process without FSDP2: the same model, batches and entries."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with runner.attach(model, hooks=["clip", "stats"], out_dir=out) as run:
        for _ in range(3):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            run.backward(loss)
            run.step(loss)
            opt.step()
            opt.zero_grad()
    return out
