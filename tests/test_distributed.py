"""Runs under ``torch.distributed``: each rank's part, rank 0's manifest over them, one table with ``rank``."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import runner
import runner.analysis as analysis
from conftest import docs_code

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]


def hand_written_ranks(world: int = 2, steps: int = 3) -> dict:
    """The README's ``train_ddp.py`` for every rank in one process: per-rank batches, gradients
    averaged over the ranks (what DDP does), the same SGD step everywhere. ``{(rank, step, layer, kind): tensor}``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.Generator().manual_seed(rank) for rank in range(world)]
    seen, losses = {}, {}
    for step in range(steps):
        grads = []
        for rank in range(world):
            x, y = torch.randn(4, 8, generator=batches[rank]), torch.randint(0, 3, (4,), generator=batches[rank])
            outs = [x]
            for layer in model:
                outs.append(layer(outs[-1]))
            for out in outs[1:]:
                out.retain_grad()
            loss = F.cross_entropy(outs[-1], y)
            model.zero_grad()
            loss.backward()
            losses[(rank, step)] = loss.item()
            for i, out in enumerate(outs[1:]):
                seen[(rank, step, str(i), "output")] = out.detach()
                seen[(rank, step, str(i), "grad_output")] = out.grad
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *per_rank in zip(model.parameters(), *grads):
            p.grad = sum(per_rank) / world
        opt.step()
    return seen, losses


@pytest.mark.slow
def test_the_readme_torchrun_example_gives_one_table_with_each_ranks_own_numbers(tmp_path):
    (tmp_path / "train_ddp.py").write_text(docs_code("how-to/own-model.md", "Under torchrun (DDP)", "**torchrun**"))
    command = docs_code("how-to/own-model.md", "Under torchrun (DDP)", "**torchrun**", "bash").strip()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "runs" / "ddp"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ranks"] == {"0": "rank-0", "1": "rank-1"} and manifest["complete"]

    stats, steps = analysis.load_stats(out), analysis.load_steps(out)
    assert sorted(set(stats["rank"])) == [0, 1] and set(stats.run_dir) == {str(out)}
    seen, losses = hand_written_ranks()
    assert len(stats) == len(seen)
    for row in stats.itertuples():
        t = seen[(row.rank, row.step, row.layer, row.kind)].double()
        np.testing.assert_allclose([row.mean, row.l2, row.max], [t.mean(), t.norm(), t.max()], rtol=1e-5, atol=1e-7)
    assert sorted(zip(steps["rank"], steps.step)) == sorted(losses)
    for rank, step, loss in zip(steps["rank"], steps.step, steps.loss):
        assert loss == pytest.approx(losses[(rank, step)], rel=1e-6)
    assert losses[(0, 0)] != losses[(1, 0)]  # the ranks saw different batches


def test_a_process_group_of_one_writes_its_part_and_the_manifest_over_it(tmp_path):
    """In-process (gloo, world size 1): the part is ``rank-0``, the run is read with rank 0.

    The recorder sums float32 outputs in float32 (see ``reduce_tensor``): a mean near zero is
    checked to float32's absolute accuracy, not only a relative one that cancellation defeats.
    """
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        with runner.attach(model, hooks={"s": {"type": "stats", "layers": "", "kinds": ["output"]}},
                           out_dir=tmp_path / "run") as run:
            x = torch.randn(4, 3)
            run.step(model(x).sum())
    finally:
        dist.destroy_process_group()
    part = json.loads((tmp_path / "run" / "rank-0" / "manifest.json").read_text())
    assert part["rank"] == 0 and part["world_size"] == 1
    stats = analysis.load_stats(tmp_path / "run")
    assert list(stats["rank"]) == [0] and stats["mean"].iloc[0] == pytest.approx(model(x).double().mean().item(), rel=1e-6, abs=1e-7)
    assert analysis.run_dirs(tmp_path) == [tmp_path / "run"]  # the part is not a run of its own


def test_a_part_without_the_runs_manifest_is_not_read(tmp_path):
    """A rank's part whose run was never committed (a rank failed) is left out of a sweep."""
    model = torch.nn.Linear(3, 2)
    with runner.attach(model, hooks={"s": {"type": "stats", "layers": "", "kinds": ["output"]}},
                       out_dir=tmp_path / "run" / "rank-1") as run:
        run.step(model(torch.randn(4, 3)).sum())
    with pytest.raises(FileNotFoundError, match="no complete run"):
        analysis.load_stats(tmp_path / "run")
    assert list(analysis.load_stats(tmp_path / "run" / "rank-1")["rank"]) == [1]  # read on its own, it says its rank
