"""NaN and Inf: recorded as they are (NaN, not null), and ``on_nonfinite`` warns or stays silent."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from conftest import make_config, run, stats_of
from runner.analysis import load as analysis
from runner.engine.nonfinite import NonFiniteWarning

pytestmark = pytest.mark.statistics

POISONED = ("model=custom", "model._target_=models_for_tests.PoisonedAtStep2", "data.shape=[2,3]",
            "hooks=stats", "steps=4")


def test_warn_reports_the_first_step_once_and_records_nan_as_nan(tmp_path, watch):
    with pytest.warns(NonFiniteWarning) as caught:
        out = run(make_config(*POISONED, "on_nonfinite=warn"), tmp_path / "out")
    assert [str(w.message) for w in caught] == [
        "step 2: non-finite values first appeared in hooks.stats at layer 'log' (forward output, slot 0, call 0): "
        "6 NaN, 0 Inf; later steps are not reported (see nan_count/inf_count)"]
    table = pq.read_table(out / "stats.parquet")
    assert all(table[c].null_count == 0 for c in table.column_names if c not in ("tensor_shape", "canonical"))  # canonical: no family
    df = stats_of(out, layer="log", kind="output")
    assert df.nan_count.tolist() == [0, 0, 6, 6]
    assert np.isnan(df["mean"][2:]).all() and np.isfinite(df["mean"][:2]).all()
    steps = pq.read_table(out / "steps.parquet")
    assert steps["loss"].null_count == 0 and math.isnan(steps["loss"][3].as_py())
    assert json.loads((out / "manifest.json").read_text())["complete"]


def test_ignore_records_without_a_word(tmp_path, watch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run(make_config(*POISONED, "on_nonfinite=ignore"), tmp_path / "out")
    assert stats_of(out, layer="fc2", kind="output").nan_count.tolist() == [0, 0, 6, 6]


def test_inf_is_counted_apart_from_nan(tmp_path, watch):
    out = run(make_config("model=linear", "hooks=[shift,stats]", "hooks.shift.value=1e39", "hooks.stats.kinds=[input]",
                          "hooks.stats.layers=''", "on_nonfinite=ignore"), tmp_path / "out")
    (row,) = stats_of(out, hook="stats").itertuples()
    assert (row.nan_count, row.inf_count, row.max) == (0, 6, math.inf)  # 1e39 overflows float32 to inf


def test_sweep_whose_jobs_wrote_different_columns_keeps_every_column(run_with, tmp_path):
    """A file lacking a column (an older schema) must not make the column vanish, nor NaN become null."""
    with pytest.warns(NonFiniteWarning):
        poisoned = run_with(*POISONED)
    plain = run_with("model=convnet", "hooks=stats")
    table = pq.read_table(plain / "stats.parquet")
    pq.write_table(table.drop_columns(["abs_mean"]).replace_schema_metadata(table.schema.metadata),
                   plain / "stats.parquet")
    df = analysis.load_stats(tmp_path)
    from_poisoned = df.run_dir == str(poisoned)
    assert "abs_mean" in df.columns
    assert df.loc[~from_poisoned, "abs_mean"].isna().all() and df.loc[from_poisoned, "abs_mean"].notna().sum() > 0
    assert df.loc[from_poisoned, "nan_count"].sum() > 0
    want = stats_of(poisoned)["mean"].to_numpy()
    np.testing.assert_array_equal(np.isnan(df.loc[from_poisoned, "mean"].to_numpy()), np.isnan(want))
    assert set(analysis.load_stats(tmp_path, columns=["abs_mean", "mean"]).columns) >= {"abs_mean", "mean"}


def test_int64_statistics_are_exact_past_float32_precision():
    from hooks.kernels.stats import reduce_tensor, summarize

    t = torch.tensor([2**40 + 1, 2**40 + 3], dtype=torch.int64)
    got = summarize(reduce_tensor(t).cpu().numpy()[None], np.array([2]))
    assert got["mean"][0] == 2**40 + 2 and got["min"][0] == 2**40 + 1 and got["max"][0] == 2**40 + 3


def nan_grad(grad: torch.Tensor) -> torch.Tensor:
    """A gradient hook that writes NaN (``value=nan`` is refused as a hook parameter)."""
    return torch.full_like(grad, math.nan)


#: A tensor hook on fc.bias writing NaN.
NAN_BIAS = ("+hooks.nan={type:custom,hook:tensor,target:params,layers:fc,params:[bias],fn:test_nonfinite.nan_grad}",)


def test_nonfinite_gradient_is_recorded_and_named(fault):
    """A gradient hook that writes NaN: recorded as NaN, and the error names the backward capture."""
    outcome = fault(*NAN_BIAS, "on_nonfinite=error", forwards=1)
    assert outcome.code == 1
    assert outcome.stderr == (
        "error: step 0: non-finite values first appeared in hooks.nan at layer 'fc' (backward param_grad, "
        "slot bias, call 0): 5 NaN, 0 Inf (on_nonfinite=error; on_nonfinite=warn records them and goes on)")


def test_nonfinite_gradient_is_stored_as_nan_not_null(run_with):
    with pytest.warns(NonFiniteWarning, match="hooks.nan at layer 'fc' \\(backward param_grad"):
        out = run_with("model=convnet", *NAN_BIAS)
    table = pq.read_table(out / "stats.parquet")
    assert table["mean"].null_count == 0
    df = stats_of(out, kind="param_grad", slot="bias")
    assert df.nan_count.tolist() == [5] and df["mean"].isna().all()
