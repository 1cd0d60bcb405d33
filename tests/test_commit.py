"""The commit protocol, by injection: an interrupt at every fsync and rename of a run and of an
overwrite, and a crash (no clean-up at all) at each of them, never leaves a directory whose
manifest disagrees with its files; the manifest alone says whether the run is complete."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hooks.mechanism.recorder import ID_COLUMNS, StepCaptures
from hooks.kernels.stats import STAT_COLUMNS
from runner.store.claim import claim_run_dir
from runner.store.errors import OutputError
from common.records import LOCK
from runner.store.outputs import SCHEMA_VERSION, RunOutputs

INJECTED = ("fsync", "replace", "rename")


def captures(rows: int, kept: int = 0) -> StepCaptures:
    """One step's captures of ``rows`` tensors of shape [2, 3], the first ``kept`` of them kept."""
    values = {"call": 0, "hook": "hooks.h", "phase": "forward", "kind": "output", "slot": "0",
              "tensor_shape": [2, 3], "dtype": "float32", "numel": 6}
    columns = {c: [f"l{i}" if c == "layer" else values[c] for i in range(rows)] for c in ID_COLUMNS}
    stats = {c: np.arange(rows, dtype=np.int64 if c.endswith("_count") else np.float64) for c in STAT_COLUMNS}
    return StepCaptures(columns, stats, list(range(kept)), [torch.full((2, 3), float(i)) for i in range(kept)])


def write_run(out: Path, steps: int, kept: int = 0, overwrite: bool = False, **kwargs) -> RunOutputs:
    outputs = RunOutputs(out, f"run: {steps}", overwrite=overwrite, **kwargs)
    with outputs:
        for step in range(steps):
            outputs.write_step(step, captures(4, kept), loss=0.5, wall_time_s=0.01)
    return outputs


def run_state(out: Path) -> tuple[str, int] | None:
    """``(run_id, steps)`` of the one complete run in ``out``, or ``None``; fails on any disagreement
    between the manifest and the files, and on any temporary or set-aside file."""
    names = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in names if ".tmp-" in n or ".old-" in n], names
    parquet = [n for n in names if n.endswith(".parquet")]
    if "manifest.json" not in names:
        assert parquet == [], names
        return None
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and sorted(manifest["files"]) == parquet
    for name, info in manifest["files"].items():
        table = pq.read_table(out / name)
        assert table.num_rows == info["rows"] > 0, name
        assert table.schema.metadata[b"run_id"].decode() == manifest["run_id"], name
    return manifest["run_id"], manifest["files"]["steps.parquet"]["rows"]


class Calls:
    """Counts calls of ``os.fsync``, ``os.replace`` and ``os.rename`` and raises ``exc`` at call ``at``."""

    def __init__(self, monkeypatch, at: int = 0, exc: BaseException | None = None) -> None:
        self.at, self.exc, self.log = at, exc, []
        for name in INJECTED:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            self.log.append((name, "" if name == "fsync" else Path(args[1]).name))
            if len(self.log) == self.at:
                raise self.exc
            return real(*args, **kwargs)
        return call


def count_calls(monkeypatch, out: Path, **run) -> list:
    with monkeypatch.context() as m:
        calls = Calls(m)
        write_run(out, **run)
    return calls.log


INTERRUPTS = [KeyboardInterrupt(), SystemExit(143)]


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_at_any_fsync_or_rename_of_a_run_leaves_all_or_nothing(tmp_path, monkeypatch, interrupt):
    log = count_calls(monkeypatch, tmp_path / "clean", steps=2, kept=1)
    assert ("replace", "manifest.json") in log and log.count(("fsync", "")) >= 5  # the commit is covered
    for at in range(1, len(log) + 1):
        out = tmp_path / f"at{at}"
        outputs = RunOutputs(out, "run: 2")
        with monkeypatch.context() as m, pytest.raises(type(interrupt)):
            Calls(m, at, interrupt)
            with outputs:
                for step in range(2):
                    outputs.write_step(step, captures(4, 1), loss=0.5, wall_time_s=0.01)
        state = run_state(out)
        committed_at = log.index(("replace", "manifest.json")) + 1
        assert (state is not None) == (at > committed_at) == outputs.committed, at
        assert not (out / LOCK).exists()


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_overwrite_leaves_the_old_run_or_the_new_one(tmp_path, monkeypatch, interrupt):
    clean = tmp_path / "clean"
    write_run(clean, steps=2)
    log = count_calls(monkeypatch, clean, steps=3, kept=1, overwrite=True)
    committed_at = log.index(("replace", "manifest.json")) + 1
    assert any(n == "replace" and f.startswith(".stats.parquet.old-") for n, f in log)  # the swap is covered
    for at in range(1, len(log) + 1):
        out = tmp_path / f"at{at}"
        old_id, _ = run_state(write_run(out, steps=2).out_dir)
        outputs = RunOutputs(out, "run: 3", overwrite=True)
        with monkeypatch.context() as m, pytest.raises(type(interrupt)):
            Calls(m, at, interrupt)
            with outputs:
                for step in range(3):
                    outputs.write_step(step, captures(4, 1), loss=0.5, wall_time_s=0.01)
        run_id, steps = run_state(out)
        if at > committed_at:
            assert (run_id, steps) == (outputs.claim.run_id, 3) and outputs.committed
            assert (out / "tensors.parquet").exists()
        else:
            assert (run_id, steps) == (old_id, 2) and not outputs.committed, at
            assert not (out / "tensors.parquet").exists()


class Crash(BaseException):
    """The process dies here: no ``finally``, no ``__exit__`` clean-up."""


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
def test_a_crash_at_any_step_is_rolled_back_or_forward_by_the_next_claim(tmp_path, monkeypatch, overwrite):
    if overwrite:
        write_run(tmp_path / "clean", steps=2)
    log = count_calls(monkeypatch, tmp_path / "clean", steps=1, kept=1, overwrite=overwrite)
    for at in range(1, len(log) + 1):
        out = tmp_path / f"at{at}"
        old = run_state(write_run(out, steps=2).out_dir) if overwrite else None
        outputs = RunOutputs(out, "run: 1", overwrite=overwrite)
        with monkeypatch.context() as m, pytest.raises(Crash):
            m.setattr(RunOutputs, "_abandon", lambda self: self._writer and self._writer.close(discard=True))
            Calls(m, at, Crash())
            with outputs:
                outputs.write_step(0, captures(4, 1), loss=0.5, wall_time_s=0.01)
        (out / LOCK).unlink(missing_ok=True)  # the dead run's claim, which the next one takes over
        claim_run_dir(out, overwrite=True).release()
        state = run_state(out)
        new = (outputs.claim.run_id, 1) if outputs.claim else "never claimed"
        assert state in (old, new), at
        assert (state == new) == outputs.committed, at


def test_a_failed_overwrite_keeps_the_old_run(tmp_path):
    out = write_run(tmp_path / "run", steps=2).out_dir
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError, match="model failed"):
        with RunOutputs(out, "run: new", overwrite=True) as outputs:
            outputs.write_step(0, captures(4, 1), loss=0.5, wall_time_s=0.01)
            raise RuntimeError("model failed")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_replaces_every_file_of_the_old_run(tmp_path):
    out = write_run(tmp_path / "run", steps=2, kept=1).out_dir
    outputs = write_run(out, steps=3, overwrite=True)
    assert run_state(out) == (outputs.claim.run_id, 3)
    assert not (out / "tensors.parquet").exists()  # the new run keeps no tensor
    assert json.loads((out / "manifest.json").read_text())["replaced"] == [
        "stats.parquet", "tensors.parquet", "steps.parquet", "config.yaml"]


def test_no_tensor_kept_means_no_tensors_file(tmp_path):
    outputs = write_run(tmp_path / "run", steps=2)
    manifest = json.loads((outputs.out_dir / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["stats.parquet", "steps.parquet"]
    assert sorted(p.name for p in outputs.out_dir.iterdir()) == [
        "config.yaml", "manifest.json", "stats.parquet", "steps.parquet"]


def test_tensor_columns_cannot_collide_with_pandas_attributes(tmp_path):
    out = write_run(tmp_path / "run", steps=1, kept=2).out_dir
    table = pq.read_table(out / "tensors.parquet")
    assert table.schema.metadata[b"schema_version"].decode() == SCHEMA_VERSION == "2"
    assert {"values", "shape"}.isdisjoint(table.column_names)
    assert table.schema.field("tensor_values").type == pa.large_list(pa.float32())
    assert pq.read_schema(out / "stats.parquet").field("tensor_shape").type == pa.list_(pa.int64())
    df = table.to_pandas()
    second = np.asarray(df["tensor_values"][1], dtype=np.float32).reshape(df["tensor_shape"][1])
    np.testing.assert_array_equal(second, torch.full((2, 3), 1.0).numpy())


def test_extra_is_recorded_in_the_manifest_and_cannot_replace_its_keys(tmp_path):
    outputs = write_run(tmp_path / "run", steps=1, extra={"seed": 7, "lifetimes": {"hooks.clip": [0, 3]}})
    manifest = json.loads((outputs.out_dir / "manifest.json").read_text())
    assert manifest["seed"] == 7 and manifest["lifetimes"] == {"hooks.clip": [0, 3]}
    assert manifest["run_id"] == outputs.claim.run_id
    with pytest.raises(ValueError, match=r"\['files', 'run_id'\]"):
        RunOutputs(tmp_path / "other", "x", extra={"files": {}, "run_id": "mine"})


def test_outputs_work_with_a_claim_made_before_and_leave_its_release_to_the_caller(tmp_path):
    claim = claim_run_dir(tmp_path / "run", overwrite=False)
    (tmp_path / "run" / ".hydra").mkdir()  # what Hydra writes after the claim
    outputs = write_run(tmp_path / "run", steps=1, claim=claim)
    assert outputs.committed and claim.committed and (tmp_path / "run" / LOCK).exists()
    claim.release()
    assert not (tmp_path / "run" / LOCK).exists()
    assert run_state(tmp_path / "run")[0] == claim.run_id


def test_a_background_write_error_surfaces_as_the_one_line_output_error(tmp_path, monkeypatch):
    def full(self, table, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    out = tmp_path / "run"
    with pytest.raises(OutputError) as info:
        write_run(out, steps=3, row_group_bytes=1)
    assert str(info.value) == f"cannot write '{out}/stats.parquet': No space left on device"
    assert sorted(p.name for p in out.iterdir()) == []
