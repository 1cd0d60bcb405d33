"""The parquet contract: columns, types, tensors readable without this project, atomic writes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import runner.analysis as analysis
from conftest import make_config, run, seeded_batch
from models_for_tests import TwoOutputs

ID_TYPES = {"step": pa.int64(), "call": pa.int64(), "hook": pa.string(), "layer": pa.string(),
            "kind": pa.string(), "slot": pa.string(), "tensor_shape": pa.list_(pa.int64()),
            "dtype": pa.string(), "numel": pa.int64()}
STAT_TYPES = {c: pa.float64() for c in ("mean", "std", "min", "max", "abs_mean", "l2", "zero_frac")}
STAT_TYPES |= {"nan_count": pa.int64(), "inf_count": pa.int64()}


def test_stats_schema_and_manifest(run_with):
    run_dir = run_with("model=convnet", "hooks=[stats,clip]")
    schema = pq.read_schema(run_dir / "stats.parquet")
    for name, typ in (ID_TYPES | STAT_TYPES).items():
        assert schema.field(name).type == typ, name
    assert schema.metadata[b"schema_version"] == b"2"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["complete"] is True
    for name, info in manifest["files"].items():
        assert pq.read_metadata(run_dir / name).num_rows == info["rows"]
        assert pq.read_schema(run_dir / name).metadata[b"config_hash"].decode() == manifest["config_hash"]
    assert manifest["overrides"] == ["model=convnet", "hooks=[stats,clip]"]
    assert sorted(manifest["files"]) == ["stats.parquet", "steps.parquet"]  # no tensor kept: no tensors.parquet
    assert set(pd.read_parquet(run_dir / "stats.parquet").kind) == {"output", "grad_output", "param_grad", "clipped"}


def test_tensors_parquet_reads_with_plain_pandas(run_with):
    run_dir = run_with("model=convnet", "hooks=extract", "hooks.extract.layers=[conv,fc]",
                       "hooks.extract.kinds=[input,output]", "loss=none")
    df = pd.read_parquet(run_dir / "tensors.parquet")  # no project code involved
    assert len(df) == 4 and set(df.kind) == {"input", "output"}
    conv_in = df[(df.layer == "conv") & (df.kind == "input")].iloc[0]
    x = np.asarray(conv_in["tensor_values"], dtype=np.float32).reshape(conv_in["tensor_shape"])
    np.testing.assert_array_equal(x, seeded_batch([1, 3, 8, 8]).numpy())

    loaded = analysis.load_tensors(run_dir)
    assert "tensor_values" not in loaded.columns
    fc_out = loaded[(loaded.layer == "fc") & (loaded.kind == "output")].tensor.iloc[0]
    assert fc_out.shape == (1, 5) and fc_out.dtype == np.float32


def test_steps_and_calls_are_counted_per_step(run_with):
    run_dir = run_with("model=resnet18", "data.shape=[2,3,32,32]", "steps=3", "loss=none",
                       "hooks=stats", "hooks.stats.kinds=[output]", "hooks.stats.layers=layer1.0.relu")
    df = analysis.load_stats(run_dir)
    assert sorted(df.step.unique()) == [0, 1, 2]
    assert (df.groupby("step").call.apply(sorted) == pd.Series([[0, 1]] * 3)).all()
    steps = analysis.load_steps(run_dir)
    assert steps.step.tolist() == [0, 1, 2] and steps.loss.isna().all() and (steps.captures == 2).all()
    # randn draws a new batch each step
    assert df[df.call == 0]["mean"].nunique() == 3


def test_slots_name_tuple_positions_and_dict_keys(run_with):
    run_dir = run_with("model=custom", "model._target_=models_for_tests.TwoOutputs", "data.shape=[2,3]",
                       "hooks=stats", "hooks.stats.layers=split")
    df = analysis.load_stats(run_dir)
    assert sorted(df[df.kind == "output"].slot) == ["0", "1.half"]
    assert sorted(df[df.kind == "grad_output"].slot) == ["0"]  # the dict half is not on the loss path
    model = TwoOutputs.instances[-1]
    assert not model.split._forward_hooks


def test_failed_run_leaves_no_parquet_and_no_temp_file(tmp_path):
    cfg = make_config("model=custom", "model._target_=models_for_tests.Exploding", "data.shape=[2,3]",
                      "hooks=stats")
    with pytest.raises(RuntimeError, match="boom"):
        run(cfg, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_sweep_loads_as_one_table_with_override_columns(run_with, tmp_path):
    for clip_max in (0.1, 0.001):
        run(make_config("model=convnet", "hooks=clip", f"hooks.clip.max={clip_max}", f"hooks.clip.min=-{clip_max}"),
            tmp_path / "sweep" / str(clip_max), ["model=convnet", "hooks=clip", f"hooks.clip.max={clip_max}"])
    df = analysis.load_stats(tmp_path / "sweep", columns=["layer", "slot", "phase", "max"],
                             filters=[("phase", "=", "after_backward")])
    assert set(df.columns) == {"layer", "slot", "phase", "max", "model", "hooks", "hooks.clip.max", "rank", "run_dir"}
    assert (df["max"] <= df["hooks.clip.max"] * (1 + 1e-7)).all()  # float32(0.001) > 0.001
    assert sorted(df["hooks.clip.max"].unique()) == [0.001, 0.1]
    with pytest.raises(FileNotFoundError, match="no complete run"):
        analysis.load_stats(tmp_path / "nothing-here")


def test_repeated_runs_in_one_process_are_identical(run_with):
    a = analysis.load_stats(run_with("model=convnet", "hooks=stats")).drop(columns="run_dir")
    b = analysis.load_stats(run_with("model=convnet", "hooks=stats")).drop(columns="run_dir")
    pd.testing.assert_frame_equal(a, b)
    assert torch.nn.modules.module._global_forward_hooks == {}
