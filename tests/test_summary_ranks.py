"""The summary of a run of several ranks counts each tensor once: rows every rank records alike (their
part manifests' ``same_on_every_rank``) are read from the first rank, each rank's own rows from every
rank. The parts are made by hand here (two one-process runs, committed as a torchrun run commits its
ranks); ``tests/test_fsdp_cli.py`` checks the real FSDP2 run under torchrun."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import runner
import runner.analysis as analysis
from common.ranks import SAME_ON_EVERY_RANK
from common.records import CONFIG, MANIFEST
from runner.analysis.answers.statistics import clipped, once_per_tensor
from runner.analysis.summary import summarize_run

HOOKS = {"clip": {"type": "clamp", "layers": "**", "min": -0.02, "max": 0.02},
         "stats": {"type": "stats", "layers": "**", "kinds": ["output"]}}


def one_process(out_dir, data_seed: int):
    """Two steps of a small MLP under ``HOOKS`` on the batches of ``data_seed``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(data_seed)
    with runner.attach(model, hooks=HOOKS, out_dir=out_dir) as run:
        for _ in range(2):
            x, y = torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            model.zero_grad()
            run.step(loss)
    return out_dir


def two_ranks(tmp_path, same, seeds=(0, 0)):
    """A run whose ranks' parts are the runs of ``seeds`` (one per rank), its parts' manifests saying ``same``."""
    run = tmp_path / "ranks"
    for rank, seed in enumerate(seeds):
        part = one_process(run / f"rank-{rank}", seed)
        manifest = json.loads((part / MANIFEST).read_text())
        manifest.update({"rank": rank, "world_size": len(seeds), SAME_ON_EVERY_RANK: same})
        (part / MANIFEST).write_text(json.dumps(manifest))
    shutil.copy(run / "rank-0" / CONFIG, run / CONFIG)
    (run / MANIFEST).write_text(json.dumps({"run_id": "hand-made", "files": {CONFIG: {}},
                                            "ranks": {str(r): f"rank-{r}" for r in range(len(seeds))}}))
    return run


def lines_of(run_dir) -> list[str]:
    return summarize_run(run_dir)[1:]  # the entries' lines (the first names the run and its ranks)


def test_rows_every_rank_records_alike_are_counted_once(tmp_path):
    whole = one_process(tmp_path / "whole", 0)
    run = two_ranks(tmp_path, True)
    assert sorted(set(analysis.load_stats(run)["rank"])) == [0, 1]
    assert lines_of(run) == lines_of(whole)
    assert lines_of(whole)[0].startswith("  clip (clamp): clipped ")


def test_only_the_listed_rows_are_counted_once_and_each_rank_s_own_rows_stay(tmp_path):
    """FSDP2 in a loop feeding each rank its own batch: the gradients' rows are the whole tensor's on every
    rank (listed), the activations' each rank's own."""
    keys = [["clip", layer, phase, kind, slot] for layer in ("0", "2") for slot in ("weight", "bias")
            for phase, kind in (("backward", "param_grad"), ("backward", "clipped"), ("after_backward", "param_grad"))]
    run = two_ranks(tmp_path, keys, seeds=(0, 1))
    stats = analysis.load_stats(run)
    counted = once_per_tensor(stats, run)
    assert set(counted[counted.hook == "clip"]["rank"]) == {0}
    assert len(counted[counted.hook == "clip"]) == len(stats[(stats.hook == "clip") & (stats["rank"] == 0)]) > 0
    outputs = stats[stats.hook == "stats"]
    assert counted[counted.hook == "stats"].equals(outputs) and set(outputs["rank"]) == {0, 1}
    assert clipped(counted) == clipped(analysis.load_stats(tmp_path / "ranks" / "rank-0"))


@pytest.mark.parametrize("same", [[], None])
def test_a_run_whose_ranks_record_their_own_rows_counts_every_rank(tmp_path, same):
    """DDP (each rank its batch and its own gradients), or a run written before the manifests said: every row."""
    run = two_ranks(tmp_path, same, seeds=(0, 1))
    parts = [clipped(analysis.load_stats(run / f"rank-{rank}")) for rank in (0, 1)]
    total = clipped(once_per_tensor(analysis.load_stats(run), run))
    assert (total.gradients, total.of, total.elements, total.numel) == tuple(
        a + b for a, b in zip((parts[0].gradients, parts[0].of, parts[0].elements, parts[0].numel),
                              (parts[1].gradients, parts[1].of, parts[1].elements, parts[1].numel)))


def test_an_fsdp2_part_lists_its_whole_tensor_rows_and_not_its_own_activations(tmp_path):
    """What the reader above relies on, written by a real FSDP2 run (one rank, gloo, in this process): the
    rows made from sharded gradients are listed, the activations' rows are not."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = fully_shard(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), mesh=init_device_mesh("cpu", (1,)))
        with runner.attach(model, hooks=HOOKS, out_dir=tmp_path / "run") as run:
            loss = model(torch.randn(5, 6)).sum()
            run.backward(loss)
            run.step(loss)
    finally:
        dist.destroy_process_group()
    listed = json.loads((tmp_path / "run" / "rank-0" / MANIFEST).read_text())[SAME_ON_EVERY_RANK]
    stats = analysis.load_stats(tmp_path / "run")
    assert sorted(listed) == sorted(map(list, set(stats[stats.hook == "clip"][["hook", "layer", "phase", "kind", "slot"]]
                                                  .itertuples(index=False, name=None))))
    assert {"param_grad", "clipped"} == {kind for _, _, _, kind, _ in listed}
    assert set(stats[stats.hook == "stats"].layer) == {"", "0", "1", "2"}  # the outputs: each rank's own, not listed
