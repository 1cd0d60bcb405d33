"""``hooks=store``: a layer's outputs over a whole dataset in safetensors shards, read back as a ``Dataset``.

The oracle is a plain forward of the same model over the same images (read by torchvision's
``ImageFolder`` in index order, in batches of the run's size), its ``layer3`` output kept in memory.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from conftest import image_folder_of, make_config, run
from datasets_for_tests import ImagesFailingAt
from common.errors import ConfigError
from runner.engine.plan import compile_plan
from runner.sources.models import build_model
from runner.store.activations import ActivationStore, ShuffledStore

PASS = ("model=resnet18", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=store",
        "hooks.store.shard_size=64")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> str:
    return image_folder_of(tmp_path_factory.mktemp("images"), 150, seed=1)


def folder_data(path: str) -> tuple[str, ...]:
    return ("data=imagefolder", f"data.path={path}", "data.resize=32", "data.crop=32", "data.batch_size=25")


def layer3_outputs(path: str) -> torch.Tensor:
    """``layer3`` of a plain forward over every image, in index order, batches of 25."""
    plan = compile_plan(make_config(*PASS[:-2], *folder_data(path)))
    torch.manual_seed(0)
    model = build_model(plan.model).eval()
    kept = []
    handle = model.layer3.register_forward_hook(lambda m, a, out: kept.append(out.detach().clone()))
    with torch.no_grad():
        for x, _ in DataLoader(ImagesFailingAt(path), batch_size=25):
            model(x)
    handle.remove()
    return torch.cat(kept)


@pytest.fixture(scope="module")
def expected(image_folder) -> torch.Tensor:
    return layer3_outputs(image_folder)


def test_store_of_layer3_reads_back_equal_to_a_plain_forward(tmp_path, image_folder, expected):
    run(make_config(*PASS, *folder_data(image_folder), f"hooks.store.path={tmp_path / 'store'}"), tmp_path / "run")
    store = ActivationStore(tmp_path / "store" / "layer3")
    manifest = json.loads((tmp_path / "store" / "layer3" / "store.json").read_text())
    assert [s["rows"] for s in manifest["shards"]] == [64, 64, 22] and manifest["complete"]
    assert len(store) == 150
    rows = [store[i] for i in range(len(store))]
    assert [sample for _, sample in rows] == list(range(150))
    assert torch.equal(torch.stack([x for x, _ in rows]), expected)
    shuffled = list(ShuffledStore(tmp_path / "store" / "layer3", seed=3))
    order = [sample for _, sample in shuffled]
    assert sorted(order) == list(range(150)) and order != list(range(150))
    assert order == [sample for _, sample in ShuffledStore(tmp_path / "store" / "layer3", seed=3)]
    assert all(torch.equal(x, expected[sample]) for x, sample in shuffled)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_store_keeps_the_dtype_asked_for(tmp_path, image_folder, expected, dtype):
    run(make_config(*PASS, *folder_data(image_folder), f"hooks.store.path={tmp_path / 'store'}",
                    f"hooks.store.dtype={dtype}"), tmp_path / "run")
    store = ActivationStore(tmp_path / "store" / "layer3")
    got = torch.stack([store[i][0] for i in range(len(store))])
    assert got.dtype == getattr(torch, dtype)
    assert torch.equal(got, expected.to(getattr(torch, dtype)))


def test_a_pass_killed_mid_shard_resumes_at_the_first_incomplete_shard(tmp_path, image_folder, monkeypatch):
    """The resumed pass runs the model on the items after the complete shards only, and its store
    ends equal to an uninterrupted pass's."""
    from runner.engine import loop

    data = ("data=dataset", "data._target_=datasets_for_tests.ImagesFailingAt", f"+data.kwargs.path={image_folder}",
            "data.batch_size=25", "data.shuffle=false", "hooks.store.shard_size=50")
    whole = tmp_path / "whole"
    run(make_config(*PASS, *data, f"hooks.store.path={whole}"), tmp_path / "run0")
    killed = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="item 140: the pass is killed here"):
        run(make_config(*PASS, *data, f"hooks.store.path={killed}", "+data.kwargs.fail_at=140"), tmp_path / "run1")
    left = json.loads((killed / "layer3" / "store.json").read_text())
    assert [s["rows"] for s in left["shards"]] == [50, 50] and not left["complete"]  # shard 2's 25 rows lost
    first = (killed / "layer3" / "shard-00000.safetensors").stat().st_mtime_ns
    batches, real = [], loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda *args: batches.append(args[2].samples.tolist()) or real(*args))
    resumed = run(make_config(*PASS, *data, f"hooks.store.path={killed}"), tmp_path / "run2")
    assert batches == [list(range(100, 125)), list(range(125, 150))]  # the model never ran on the stored 100
    assert json.loads((resumed / "manifest.json").read_text())["resumed_at_step"] == 4
    assert (killed / "layer3" / "shard-00000.safetensors").stat().st_mtime_ns == first  # kept, not written again
    done = json.loads((killed / "layer3" / "store.json").read_text())
    assert done == json.loads((whole / "layer3" / "store.json").read_text())
    for name in ("shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"):
        assert_same_shard(killed / "layer3" / name, whole / "layer3" / name)


def assert_same_shard(path, expected) -> None:
    """Two shard files hold the same tensors, dtype included."""
    got, want = load_file(path), load_file(expected)
    assert sorted(got) == sorted(want) == ["activations", "samples"], path
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want), path


def test_a_pass_holding_part_of_a_batch_runs_that_batch_whole_and_a_complete_store_one_batch(tmp_path, monkeypatch):
    """Shards of 100 digits, batches of 64: the resumed pass begins at the batch holding sample 100 (the
    batches of an uninterrupted pass); a store already complete runs its last batch only."""
    from runner.engine import loop

    common = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=store",
              "hooks.store.layers=[fc]", "hooks.store.shard_size=100", "data.batch_size=64")
    run(make_config(*common, f"hooks.store.path={tmp_path / 'whole'}"), tmp_path / "run0")
    store = tmp_path / "cut" / "fc"
    store.mkdir(parents=True)
    manifest = json.loads((tmp_path / "whole" / "fc" / "store.json").read_text())
    (store / "store.json").write_text(json.dumps({**manifest, "shards": manifest["shards"][:1], "complete": False}))
    (store / "shard-00000.safetensors").write_bytes((tmp_path / "whole" / "fc" / "shard-00000.safetensors").read_bytes())
    batches, real = [], loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda *args: batches.append(int(args[2].samples[0])) or real(*args))
    run(make_config(*common, f"hooks.store.path={tmp_path / 'cut'}"), tmp_path / "run1")
    assert batches == list(range(64, 1797, 64))
    for name in sorted(p.name for p in (tmp_path / "whole" / "fc").glob("*.safetensors")):
        assert_same_shard(store / name, tmp_path / "whole" / "fc" / name)
    batches.clear()
    run(make_config(*common, f"hooks.store.path={tmp_path / 'cut'}"), tmp_path / "run2")
    assert batches == [1792]
    whole = json.loads((tmp_path / "whole" / "fc" / "store.json").read_text())
    assert json.loads((store / "store.json").read_text()) == whole


def test_a_store_needs_a_path_and_a_known_dtype():
    with pytest.raises(ConfigError, match="hooks.store.path: required"):
        compile_plan(make_config("hooks=store"))
    with pytest.raises(ConfigError, match="hooks.store.dtype: unknown dtype 'float8'"):
        compile_plan(make_config("hooks=store", "hooks.store.path=x", "hooks.store.dtype=float8"))


def test_the_stores_of_a_sharded_pass_read_as_one_store(tmp_path):
    common = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=store",
              "hooks.store.layers=[fc]", "hooks.store.shard_size=256")
    run(make_config(*common, f"hooks.store.path={tmp_path / 'one'}"), tmp_path / "run")
    for shard in (2, 0, 1):  # in any order: the stores are read in the order of their sample ids
        run(make_config(*common, f"hooks.store.path={tmp_path / str(shard)}", f"data.shard={shard}",
                        "data.num_shards=3"), tmp_path / f"run{shard}")
    one = ActivationStore(tmp_path / "one" / "fc")
    merged = ActivationStore(*(tmp_path / str(shard) / "fc" for shard in (1, 2, 0)))
    assert len(merged) == len(one) == 1797
    assert [merged[i][1] for i in range(1797)] == list(range(1797))
    # the shards' batches are not the one job's (599 is no multiple of 64): float32 may differ in its last bits
    torch.testing.assert_close(torch.stack([merged[i][0] for i in range(1797)]),
                               torch.stack([one[i][0] for i in range(1797)]), rtol=1e-6, atol=1e-6)
    assert sorted(s for _, s in ShuffledStore(*(tmp_path / str(shard) / "fc" for shard in range(3)))) == list(range(1797))


def test_a_store_of_ranks_is_read_only_with_every_ranks_part_complete(tmp_path):
    """What ``hooks.store`` writes under ``torch.distributed``: ``path/LAYER/rank-N``, each part a store."""
    from hooks.formats.store_files import ShardWriter

    layer = tmp_path / "fc"
    rows = torch.arange(12.0).view(6, 2)
    for rank in (1, 0):
        writer = ShardWriter(layer / f"rank-{rank}", "fc", 2, "float32", (rank, 2))
        writer.add(rows[3 * rank:3 * rank + 3], torch.arange(3 * rank, 3 * rank + 3))
        if rank == 1:
            with pytest.raises(FileNotFoundError, match="no complete activation store at .*rank-1"):
                ActivationStore(layer)
            writer.finish()
            with pytest.raises(FileNotFoundError, match=r"has the parts of ranks \[1\] of a run on 2 ranks"):
                ActivationStore(layer)
    writer.finish()
    store = ActivationStore(layer)
    assert [store[i][1] for i in range(6)] == list(range(6))
    assert torch.equal(torch.stack([store[i][0] for i in range(6)]), rows)


def test_a_rank_share_dealt_every_world_size_th_sample_is_refused_at_its_first_batch(tmp_path):
    """What a ``DistributedSampler`` gives rank 0 of 2 (samples 0, 2, 4, ...): refused before a row is
    kept, not a batch later; a hole between two batches is refused too, and the store keeps its shards."""
    from hooks.formats.store_files import ShardWriter

    writer = ShardWriter(tmp_path / "dealt", "fc", 4, "float32", (0, 2))
    with pytest.raises(ValueError, match=r"a batch holds samples 0, 2, 4, 6, not consecutive ones; .*world_size-th"):
        writer.add(torch.randn(4, 3), torch.tensor([0, 2, 4, 6]))
    assert writer._filled == 0 and sorted(p.name for p in (tmp_path / "dealt").iterdir()) == []
    writer = ShardWriter(tmp_path / "gap", "fc", 4, "float32")
    rows = torch.randn(10, 3)
    writer.add(rows[:5], torch.arange(5))
    with pytest.raises(ValueError, match=r"samples 5\.\.6 never came"):
        writer.add(rows[7:], torch.arange(7, 10))
    assert json.loads((tmp_path / "gap" / "store.json").read_text())["shards"][0]["rows"] == 4
    assert torch.equal(load_file(tmp_path / "gap" / "shard-00000.safetensors")["activations"], rows[:4])
