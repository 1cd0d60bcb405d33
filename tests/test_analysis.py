"""Loaders over one run and a sweep, parquet projection, depth order and the abnormality checks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import runner.analysis as analysis
from conftest import make_config, run, seeded_batch

pytestmark = pytest.mark.statistics

CLIP_MAXES = (1.0, 0.01, 0.0001)


@pytest.fixture(scope="module")
def written_sweep(tmp_path_factory):
    """Three convnet jobs that differ only in the clip bound, laid out as Hydra's multirun does: run once."""
    where = tmp_path_factory.mktemp("written") / "sweep"
    for i, bound in enumerate(CLIP_MAXES):
        overrides = ["model=convnet", "hooks=[clip,stats]", f"hooks.clip.max={bound}", "steps=2"]
        run(make_config(*overrides), where / str(i), overrides)
    return where


@pytest.fixture
def sweep(written_sweep, tmp_path):
    """A copy of the written sweep of the test's own, which it may change."""
    return shutil.copytree(written_sweep, tmp_path / "sweep")


class DeadReLU(nn.Module):
    """Linear(3, 4) -> ReLU -> Linear(4, 2) whose first ``dead`` hidden units can never fire."""

    def __init__(self, dead: int = 2) -> None:
        super().__init__()
        self.fc1, self.relu, self.fc2 = nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)
        with torch.no_grad():
            self.fc1.weight.mul_(0.1)
            self.fc1.bias.fill_(10.0)
            self.fc1.bias[:dead] = -10.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sqrt()


class SqrtNet(nn.Module):
    """Linear(3, 3) then a square root: NaN wherever the linear output is negative."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.sqrt = nn.Linear(3, 3), Sqrt()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sqrt(self.fc(x))


def test_one_run_has_run_dir_and_override_columns(run_with):
    run_dir = run_with("model=convnet", "hooks=stats")
    df = analysis.load_stats(run_dir)
    assert set(df.run_dir) == {str(run_dir)}
    assert (df.model == "convnet").all() and (df.hooks == "stats").all()
    assert set(df.layer) == {"conv", "relu", "flatten", "fc"}


def test_sweep_is_one_table_with_each_jobs_overrides(sweep):
    df = analysis.load_stats(sweep)
    assert df.groupby("hooks.clip.max").run_dir.nunique().to_dict() == dict.fromkeys(CLIP_MAXES, 1)
    assert df["hooks.clip.max"].dtype == np.float64  # numbers stay numbers: they sort and compute as numbers
    for text in ("model", "hooks", "run_dir"):  # text is categorical: one string per job, not per row
        assert isinstance(df[text].dtype, pd.CategoricalDtype)
    assert df["run_dir"].cat.categories.tolist() == [str(sweep / str(i)) for i in range(3)]
    assert analysis.override_columns(df) == ["model", "hooks", "hooks.clip.max", "steps"]
    assert df["steps"].dtype == np.int64
    final = df[df.phase == "after_backward"]
    for bound, rows in final.groupby("hooks.clip.max"):
        assert (rows["max"] <= bound * (1 + 1e-7)).all()
    steps = analysis.load_steps(sweep)
    assert len(steps) == 6 and sorted(steps.groupby("run_dir").step.apply(list).tolist()) == [[0, 1]] * 3


def test_projection_and_filters_are_pushed_into_one_dataset_scan(sweep, monkeypatch):
    scans = []
    real = analysis.load._dataset

    class Spy:
        def __init__(self, dataset):
            self.dataset, self.schema = dataset, dataset.schema

        def scanner(self, **kw):
            scans.append(kw)
            return self.dataset.scanner(**kw)

    monkeypatch.setattr(analysis.load, "_dataset", lambda *args: Spy(real(*args)))
    full = analysis.load_stats(sweep)
    df = analysis.load_stats(sweep, columns=["layer", "l2"], filters=[("kind", "=", "param_grad")])
    assert set(df.columns) == {"layer", "l2", "model", "hooks", "hooks.clip.max", "steps", "rank", "run_dir"}
    assert len(df) == (full.kind == "param_grad").sum()
    # the same values; the categories are those of the rows read (a filtered read has fewer layers)
    pd.testing.assert_frame_equal(df.reset_index(drop=True),
                                  full[full.kind == "param_grad"][list(df.columns)].reset_index(drop=True),
                                  check_categorical=False, check_dtype=False)
    assert len(scans) == 2  # one scan over the three jobs' files, not one read per file
    assert scans[-1]["columns"] == ["layer", "l2"]
    assert scans[-1]["filter"].equals(pq.filters_to_expression([("kind", "=", "param_grad")]))
    steps = analysis.load_steps(sweep, columns=["loss"], filters=[("step", "=", 1)])
    assert len(steps) == 3 and "wall_time_s" not in steps.columns


def _swap_tensor_column_names(path):
    """Rewrite a parquet file under the other schema version's tensor column names (values <-> tensor_values)."""
    swap = {"values": "tensor_values", "shape": "tensor_shape", "tensor_values": "values", "tensor_shape": "shape"}
    table = pq.read_table(path)
    pq.write_table(table.rename_columns([swap.get(c, c) for c in table.column_names]), path)


def test_both_schema_versions_load_under_the_new_names(tmp_path):
    for i in range(2):
        overrides = ["model=convnet", "hooks=[stats,extract]", "hooks.extract.layers=conv", f"seed={i}"]
        run(make_config(*overrides), tmp_path / str(i), overrides)
    before = {name: loader(tmp_path) for name, loader in (("stats", analysis.load_stats),
                                                           ("tensors", analysis.load_tensors))}
    for name in ("stats.parquet", "tensors.parquet"):
        _swap_tensor_column_names(tmp_path / "1" / name)  # a sweep with one job of each version
    after = {"stats": analysis.load_stats(tmp_path), "tensors": analysis.load_tensors(tmp_path)}
    for name, df in after.items():
        assert "tensor_shape" in df.columns and not {"shape", "values", "tensor_values"} & set(df.columns)
        assert df["tensor_shape"].map(list).tolist() == before[name]["tensor_shape"].map(list).tolist()
    for old, new in zip(before["tensors"]["tensor"], after["tensors"]["tensor"]):
        np.testing.assert_array_equal(old, new)
    assert after["tensors"]["tensor"].iloc[0].shape == (1, 10, 4, 4)


def test_a_column_only_some_jobs_wrote_is_kept(sweep):
    path = sweep / "1" / "steps.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("learning_rate", pa.array([0.5] * len(table))), path)
    steps = analysis.load_steps(sweep)
    rates = {Path(k).name: v for k, v in steps.groupby(steps["run_dir"].astype(str)).learning_rate.apply(list).items()}
    assert rates["1"] == [0.5, 0.5] and np.isnan(rates["0"] + rates["2"]).all()


def test_a_run_without_tensors_parquet_has_no_tensors(run_with):
    run_dir = run_with("model=linear", "hooks=stats")
    (run_dir / "tensors.parquet").unlink(missing_ok=True)
    tensors = analysis.load_tensors(run_dir)
    assert tensors.empty and {"layer", "kind", "tensor", "run_dir"} <= set(tensors.columns)
    assert analysis.dead_units(tensors).empty


def test_failed_jobs_are_listed_with_their_overrides_and_error(sweep):
    failed = sweep / "3"
    failed.mkdir()
    (failed / "status.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError: out of memory",
                                                    "overrides": ["model=convnet", "hooks.clip.max=9"]}))
    found = analysis.failed_jobs(sweep)
    assert found.to_dict("records") == [{"job_dir": str(failed), "overrides": "model=convnet hooks.clip.max=9",
                                         "error": "RuntimeError: out of memory"}]
    assert len(analysis.run_dirs(sweep)) == 3


def test_load_tensors_projection_keeps_what_restores_the_tensor(run_with):
    run_dir = run_with("model=convnet", "hooks=extract", "hooks.extract.layers=[conv,fc]")
    df = analysis.load_tensors(run_dir, columns=["layer"], filters=[("layer", "=", "conv")])
    assert df.layer.tolist() == ["conv"] and df.tensor.iloc[0].shape == (1, 10, 4, 4)
    assert "step" not in df.columns and "tensor_values" not in df.columns


def test_per_layer_is_in_depth_order_for_activations_and_gradients(run_with):
    run_dir = run_with("model=resnet18", "data.shape=[2,3,32,32]", "hooks=[stats,clip]",
                       "hooks.stats.layers=[conv1,layer1.0.relu,layer4,fc]")
    df = analysis.load_stats(run_dir)
    forward = ["conv1", "layer1.0.relu", "layer1.0.relu #1", "layer4", "fc"]
    assert analysis.per_layer(df, "output").label.tolist() == forward
    assert analysis.per_layer(df, "grad_output").label.tolist() == forward
    params = analysis.per_layer(df, "param_grad")
    assert set(params.phase) == {"after_backward"}
    assert params.label.tolist()[:2] == ["conv1.weight", "bn1.weight"] and params.label.iloc[-1] == "fc.bias"
    row = params.iloc[0]
    assert row.abs_max == max(abs(row["min"]), abs(row["max"]))


def test_abnormal_finds_zero_gradients_and_dead_layers(run_with):
    run_dir = run_with("model=custom", "model._target_=test_analysis.DeadReLU", "+model.dead=4",
                       "data.shape=[8,3]", "hooks=stats")
    found = analysis.abnormal(analysis.load_stats(run_dir))
    got = set(zip(found.layer, found.kind, found.problem))
    # every hidden unit is off: the ReLU outputs 0, and no gradient reaches fc1 through it
    assert got == {("relu", "output", "all zero"), ("fc1", "grad_output", "zero gradient")}
    assert found.detail.str.endswith("in each of 1 capture(s)").all()


def test_abnormal_counts_nan(run_with):
    run_dir = run_with("model=custom", "model._target_=test_analysis.SqrtNet", "data.shape=[4,3]", "hooks=stats")
    found = analysis.abnormal(analysis.load_stats(run_dir)).set_index(["layer", "kind"])
    torch.manual_seed(0)
    out = SqrtNet()(seeded_batch([4, 3]))
    expected = out.isnan().sum().item()
    assert expected > 0
    assert found.loc[("sqrt", "output"), "problem"] == "non-finite"
    assert found.loc[("sqrt", "output"), "detail"] == f"{expected} NaN and 0 Inf elements in 1 of 1 capture(s)"
    assert found.loc[("fc", "grad_output"), "problem"] == "non-finite"  # d sqrt(x)/dx is NaN for x < 0
    assert ("fc", "output") not in found.index


def test_dead_units_counts_units_that_never_fire(run_with):
    run_dir = run_with("model=custom", "model._target_=test_analysis.DeadReLU", "+model.dead=2",
                       "data.shape=[8,3]", "steps=2", "hooks=extract", "hooks.extract.layers=[relu,fc1]")
    dead = analysis.dead_units(analysis.load_tensors(run_dir))
    assert dead[["layer", "units", "dead"]].values.tolist() == [["relu", 4, 2]]  # fc1 has negative outputs
    assert dead.dead_frac.iloc[0] == 0.5


def test_override_values_are_parsed_as_hydra_reads_them(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"overrides": [
        "hooks.clip.max=1e-3", "seed=3", "+model.dead=2", "mode=eval", "plots=[a,b]", "hooks.clip.min=null",
        "compile=true"]}))
    assert analysis.overrides_of(tmp_path) == {"hooks.clip.max": 0.001, "seed": 3, "model.dead": 2, "mode": "eval",
                                               "plots": "[a,b]", "hooks.clip.min": None, "compile": True}
