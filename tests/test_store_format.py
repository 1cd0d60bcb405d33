"""An activation store other tools read correctly: safetensors shards read back with safetensors' own
library (not ours) hold what the model gave, in the dtype asked for, bfloat16 included.

The oracle is a plain forward hook on ``conv2`` of the same ``digits_cnn`` (same seed) over the same
digits in index order, in the pass's batches. A store of the layout before (``.npy`` shards) is
refused in one line by the reader and the writer alike.
"""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from torch.utils.data import DataLoader

from conftest import cli, make_config, run
from datasets_for_tests import DigitsPausingAt
from hooks.formats.store_files import ShardWriter
from runner.engine.plan import compile_plan
from runner.sources.models import build_model
from runner.store.activations import ActivationStore

PASS = ("model=digits_cnn", "data=dataset", "data._target_=datasets_for_tests.DigitsPausingAt", "data.batch_size=100",
        "data.shuffle=false", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=store",
        "hooks.store.layers=[conv2]", "hooks.store.shard_size=500")


@pytest.fixture(scope="module")
def conv2_outputs() -> torch.Tensor:
    """``conv2`` of a plain forward over every digit, in index order, batches of 100."""
    plan = compile_plan(make_config(*PASS[:-3]))
    torch.manual_seed(plan.settings.seed)
    model = build_model(plan.model).eval()
    kept = []
    handle = model.conv2.register_forward_hook(lambda m, a, out: kept.append(out.detach().clone()))
    with torch.no_grad():
        for x, _ in DataLoader(DigitsPausingAt(), batch_size=100):
            model(x)
    handle.remove()
    return torch.cat(kept)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_each_shard_reads_back_with_safetensors_as_the_model_gave_it(tmp_path, conv2_outputs, dtype):
    run(make_config(*PASS, f"hooks.store.path={tmp_path / 'store'}", f"hooks.store.dtype={dtype}"), tmp_path / "run")
    layer = tmp_path / "store" / "conv2"
    manifest = json.loads((layer / "store.json").read_text())
    assert (manifest["format"], manifest["store_version"], manifest["dtype"]) == ("safetensors", 2, dtype)
    assert [s["file"] for s in manifest["shards"]] == [f"shard-0000{i}.safetensors" for i in range(4)]
    assert [s["rows"] for s in manifest["shards"]] == [500, 500, 500, 297] and manifest["complete"]
    shards = [safetensors.torch.load_file(layer / s["file"]) for s in manifest["shards"]]
    values = torch.cat([shard["activations"] for shard in shards])
    assert values.dtype == getattr(torch, dtype) and values.shape == (1797, 32, 4, 4)
    assert torch.equal(values, conv2_outputs.to(getattr(torch, dtype)))
    assert torch.equal(torch.cat([shard["samples"] for shard in shards]), torch.arange(1797))
    if dtype != "bfloat16":  # numpy has no bfloat16: safetensors.numpy reads the other two
        arrays = [safetensors.numpy.load_file(layer / s["file"]) for s in manifest["shards"]]
        got = np.concatenate([a["activations"] for a in arrays])
        assert got.dtype == np.dtype(dtype) and np.array_equal(got, conv2_outputs.to(getattr(torch, dtype)).numpy())
    rows = ActivationStore(layer)  # and ours agrees with theirs
    assert rows[1000][0].dtype == getattr(torch, dtype) and torch.equal(rows[1000][0], values[1000])
    in_worker = pickle.loads(pickle.dumps(rows))  # what a DataLoader's worker gets, a shard mapped already
    assert torch.equal(in_worker[1001][0], values[1001]) and in_worker[1001][1] == 1001


def npy_store(path) -> None:
    """What a store pass wrote before safetensors: ``.npy`` shards and a ``store.json`` without ``format``."""
    path.mkdir(parents=True)
    np.save(path / "shard-00000.npy", np.zeros((2, 3), dtype=np.int16))
    np.save(path / "samples-00000.npy", np.arange(2))
    (path / "store.json").write_text(json.dumps({
        "layer": "fc", "shard_size": 2, "dtype": "bfloat16", "item_shape": [3], "complete": True,
        "shards": [{"index": 0, "rows": 2, "first": 0, "last": 1}]}))


def test_a_store_of_npy_shards_is_refused_in_one_line_by_the_reader_and_the_writer(tmp_path):
    npy_store(tmp_path / "fc")
    message = (f"store '{tmp_path / 'fc'}' holds .npy shards (store version 1, bfloat16 kept as int16 bits); this "
               f"version reads and writes safetensors store version 2 only: run the pass again into another path "
               f"(np.load reads the old .npy shards)")
    with pytest.raises(ValueError) as refused:
        ActivationStore(tmp_path / "fc")
    assert str(refused.value) == message
    with pytest.raises(ValueError) as refused:
        ShardWriter(tmp_path / "fc", "fc", 2, "bfloat16")
    assert str(refused.value) == message
    assert sorted(p.name for p in (tmp_path / "fc").iterdir()) == ["samples-00000.npy", "shard-00000.npy",
                                                                  "store.json"]


def test_a_pass_into_a_path_holding_an_npy_store_is_refused_before_the_run(tmp_path, capsys):
    npy_store(tmp_path / "stores" / "fc")
    with pytest.raises(SystemExit) as exited:
        cli(["model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "hooks=store",
             "hooks.store.layers=[fc]", f"hooks.store.path={tmp_path / 'stores'}"], tmp_path / "run")
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: hooks.store.path: store '{tmp_path / 'stores' / 'fc'}' holds .npy shards (store version 1, bfloat16 "
        f"kept as int16 bits); this version reads and writes safetensors store version 2 only: run the pass again "
        f"into another path (np.load reads the old .npy shards)"]
    assert not (tmp_path / "run").exists()
