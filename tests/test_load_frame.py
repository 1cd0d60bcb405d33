"""The loaders' frames hold what a plain pyarrow read of the same files holds, with text and shapes
as categoricals (``runner.analysis.frame``): whole, projected, filtered, across a sweep with
overrides and across files of both schema versions."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
import runner.analysis.frame as frame
from conftest import make_config, run

TEXT = ("hook", "layer", "phase", "kind", "slot", "dtype")


def cells(values) -> list:
    """Comparable cells: missing (None, NaN) as None, lists and arrays as tuples, numpy scalars as Python."""
    out = []
    for v in values:
        if isinstance(v, (list, tuple, np.ndarray)):
            out.append(tuple(np.asarray(v).tolist()))
        elif v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        else:
            out.append(v.item() if isinstance(v, np.generic) else v)
    return out


def assert_as_pyarrow(df: pd.DataFrame, table: pa.Table) -> None:
    """Every column of ``table`` is in ``df`` with the same cells, row for row."""
    assert len(df) == table.num_rows
    for name in table.column_names:
        assert cells(df[name].astype(object)) == cells(table[name].to_pylist()), name


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Six jobs copied from one real ``hooks=[clip,stats]`` run, each with its own overrides."""
    root = tmp_path_factory.mktemp("frame")
    overrides = ["model=convnet", "hooks=[clip,stats]", "steps=2"]
    template = root / "template"
    run(make_config(*overrides), template, overrides)
    manifest = json.loads((template / "manifest.json").read_text())
    for i in range(6):
        job = root / "sweep" / str(i)
        shutil.copytree(template, job)
        own = [f"hooks.clip.max={10.0 ** -i}", f"optimizer={['sgd', 'adam'][i % 2]}", f"seed={i}"]
        (job / "manifest.json").write_text(json.dumps({**manifest, "overrides": own}))
    return root / "sweep"


def files_of(sweep, name="stats.parquet") -> list[str]:
    return [str(r / name) for r in analysis.run_dirs(sweep)]


@pytest.mark.parametrize("columns, filters", [
    (None, None),
    (["layer", "kind", "step", "l2"], None),
    (None, [("kind", "=", "grad_output")]),
    (["layer", "tensor_shape", "max"], [("phase", "!=", "forward"), ("step", "=", 1)]),
])
def test_a_sweep_loads_as_pyarrow_reads_it_with_text_as_categoricals(sweep, columns, filters):
    df = analysis.load_stats(sweep, columns=columns, filters=filters)
    expression = None if filters is None else pq.filters_to_expression(filters)
    table = ds.dataset(files_of(sweep), format="parquet").to_table(columns=columns, filter=expression)
    assert table.num_rows and set(table.column_names) <= set(df.columns)
    assert_as_pyarrow(df, table)
    for name in table.column_names:
        numeric = pa.types.is_integer(table[name].type) or pa.types.is_floating(table[name].type)
        assert isinstance(df[name].dtype, pd.CategoricalDtype) != numeric, name
        if name in TEXT:  # sorted, as a plain string column would group and sort
            assert list(df[name].cat.categories) == sorted(set(table[name].to_pylist()))
    if "tensor_shape" in df.columns:
        assert all(isinstance(shape, tuple) for shape in df["tensor_shape"].cat.categories)
    if columns is None and filters is None:  # groupby leaves out the categories a subset lacks
        grads = df[df["kind"] == "param_grad"]
        assert set(grads.groupby("layer").size().index) == set(grads["layer"]) == {"conv", "fc"}
        assert len(grads["layer"].cat.categories) > 2


def test_each_row_carries_its_jobs_overrides(sweep):
    df = analysis.load_stats(sweep, columns=["step"])
    for run_dir, rows in df.groupby("run_dir"):
        i = int(run_dir.rsplit("/", 1)[1])
        assert (rows["hooks.clip.max"] == 10.0 ** -i).all() and (rows["seed"] == i).all()
        assert (rows["optimizer"] == ["sgd", "adam"][i % 2]).all()
    assert df["hooks.clip.max"].dtype == np.float64 and df["seed"].dtype == np.int64
    assert list(df["optimizer"].cat.categories) == ["sgd", "adam"]  # job order: job 0 is sgd
    steps = analysis.load_steps(sweep)
    assert_as_pyarrow(steps, ds.dataset(files_of(sweep, "steps.parquet"), format="parquet").to_table())
    assert isinstance(steps["split"].dtype, pd.CategoricalDtype)


def test_a_mixed_schema_sweep_loads_as_each_file_reads_under_todays_names(sweep, tmp_path):
    """Jobs 1 and 4 as version 1 wrote them (``values``/``shape``), job 2 with a column the others lack."""
    mixed = tmp_path / "mixed"
    shutil.copytree(sweep, mixed)
    for job in ("1", "4"):
        path = mixed / job / "stats.parquet"
        table = pq.read_table(path)
        pq.write_table(table.rename_columns(["shape" if c == "tensor_shape" else c for c in table.column_names]), path)
    path = mixed / "2" / "stats.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("note", pa.array(["x"] * len(table))), path)
    df = analysis.load_stats(mixed)
    tables = []
    for file in files_of(mixed):
        table = pq.read_table(file)
        table = table.rename_columns(["tensor_shape" if c == "shape" else c for c in table.column_names])
        tables.append(table.select([c for c in table.column_names if c != "tensor_shape"] + ["tensor_shape"]))
    expected = pa.concat_tables(tables, promote_options="permissive")
    assert_as_pyarrow(df, expected)
    assert df["note"].isna().sum() == len(df) - len(tables[2]) and isinstance(df["note"].dtype, pd.CategoricalDtype)


def test_to_frame_over_group_and_capacity_bounds_matches_to_pandas(monkeypatch):
    """Nulls in every type, more than 127 distinct strings, groups of two batches, too small a capacity."""
    monkeypatch.setattr(frame, "GROUP_ROWS", 40)
    n = 300
    rng = np.random.default_rng(0)
    table = pa.table({
        "i": pa.array([None if k % 11 == 0 else int(k) for k in range(n)], pa.int64()),
        "whole": pa.array(np.arange(n, dtype=np.int32)),
        "f": pa.array(rng.standard_normal(n)),
        "b": pa.array([None if k % 13 == 0 else k % 2 == 0 for k in range(n)]),
        "s": pa.array([None if k % 17 == 0 else f"name{k % 150}" for k in range(n)]),
        "d": pc.dictionary_encode(pa.array([["a", "b", None][k % 3] for k in range(n)])),
        "shape": pa.array([None if k % 19 == 0 else [k % 4] * (k % 3) for k in range(n)], pa.list_(pa.int64())),
        "vals": pa.array([[float(k)] * (k % 2) for k in range(n)], pa.list_(pa.float32())),
    })
    batches = [(batch, k) for k, batch in enumerate(table.to_batches(max_chunksize=23))]
    df, files = frame.to_frame(iter(batches), table.schema, capacity=50)
    assert_as_pyarrow(df, table)
    assert files.tolist() == [k for k, (batch, _) in enumerate(batches) for _ in range(batch.num_rows)]
    reference = table.to_pandas()
    for name in ("i", "whole", "f"):  # numbers as pyarrow converts them (int with a null: float64)
        assert df[name].dtype == reference[name].dtype, name
    assert df["b"].dtype == object and len(df["s"].cat.categories) == 150
    assert df["shape"].cat.categories.tolist() == sorted({tuple([k % 4] * (k % 3)) for k in range(n) if k % 19})


def test_a_sweep_reads_one_footer_per_schema_its_manifests_list(sweep, tmp_path, monkeypatch):
    """Six jobs of one schema: one footer read. A job whose manifest predates fingerprints, and one
    whose file changed size since its manifest, are read from their own footers."""
    read = []
    real = pq.read_schema
    monkeypatch.setattr(pq, "read_schema", lambda file, *a, **k: read.append(file) or real(file, *a, **k))
    analysis.load_stats(sweep)
    assert len(read) == 1
    listed = {json.loads((Path(file).parent / "manifest.json").read_text())["files"]["stats.parquet"]["schema"]
              for file in files_of(sweep)}
    assert len(listed) == 1 and len({real(file).remove_metadata() for file in files_of(sweep)}) == 1
    mixed = tmp_path / "mixed"
    shutil.copytree(sweep, mixed)
    manifest = json.loads((mixed / "3" / "manifest.json").read_text())
    del manifest["files"]["stats.parquet"]["schema"]
    (mixed / "3" / "manifest.json").write_text(json.dumps(manifest))
    path = mixed / "5" / "stats.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("note", pa.array(["x"] * len(table))), path)
    read.clear()
    df = analysis.load_stats(mixed)
    assert sorted(str(Path(f).parent.name) for f in read) == ["0", "3", "5"]  # the shared schema's first, 3, 5
    assert (df["note"] == "x").sum() == len(table)


def test_groups_sharing_a_dictionary_read_it_into_python_once_and_keep_their_labels(monkeypatch):
    """A sweep's files mostly hold the same layer names: a group whose dictionary equals the last group's reuses
    its codes; one with other values (a third file with a new layer, and a missing one) is coded afresh."""
    dictionaries = []
    local = frame._Labels.local
    monkeypatch.setattr(frame._Labels, "local", lambda self, values: dictionaries.append(values) or local(self, values))
    monkeypatch.setattr(frame, "GROUP_ROWS", 1)  # each batch a group of its own
    same = ["conv1", "fc", "conv1"]
    files = [same, same, ["fc", "conv9", None]]
    schema = pa.schema([("layer", pa.dictionary(pa.int32(), pa.string()))])
    batches = [(pa.record_batch([pa.array(layers).dictionary_encode()], schema=schema), i)
               for i, layers in enumerate(files)]
    df, file_of = frame.to_frame(iter(batches), schema, 4)
    assert df["layer"].tolist()[:8] == [*same, *same, "fc", "conv9"] and pd.isna(df["layer"].iloc[8])
    assert file_of.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert dictionaries == [["conv1", "fc"], ["fc", "conv9"]]
