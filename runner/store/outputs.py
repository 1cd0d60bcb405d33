"""The only code that knows parquet: schemas, the files of a run and their commit with the manifest.

A run directory holds ``stats.parquet``, ``steps.parquet``, ``tensors.parquet`` when the run
kept a tensor, and, once those are in place, ``manifest.json``. Each parquet file is streamed
into a hidden temporary file in the same directory; when the run succeeds they are made final
together with the manifest (``runner.store.commit``), so a failed or interrupted run leaves no
file that looks complete, an interrupted overwrite leaves the earlier run as it was, and once
the manifest is there nothing deletes the run. The directory is claimed for the run
(``runner.store.claim``) before anything is written. Every ``OSError`` (disk full, read-only)
becomes an ``OutputError`` naming the path, after the temporary files are gone. The schemas come
from the code, not from the first batch, so every file of a sweep has the same columns and types,
but for ``steps.parquet``'s measures (``STEP_METRICS``): only those some step of the run gave
(``accuracy`` for a classification loss, ``clean_*`` beside a patch) are columns of the file.
"""
from __future__ import annotations

import contextlib
import functools

import hashlib
import platform
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from common import records
from common.durable import TMP_MARK, sync_file, tmp_path
from common.records import (CONFIG, MANIFEST, SCHEMA_VERSION, STAT_COLUMNS, STATS, STATS_SCHEMA, STEP_METRICS, STEPS,
                            RUN_TOTAL_SCHEMAS, STEPS_SCHEMA, TABLE_SCHEMAS, TENSORS, TENSORS_SCHEMA,
                            StepCaptures, steps_schema)
from runner.store.background import BackgroundWriter
from runner.store.claim import RunClaim, check_output_dir, claim_run_dir
from runner.store.commit import commit, recover, stage_config
from runner.store.errors import OutputError, naming

__all__ = ["MANIFEST", "ROW_GROUP_BYTES", "SCHEMA_VERSION", "STATS_SCHEMA", "STEP_METRICS", "STEPS_SCHEMA", "TENSORS_SCHEMA",
           "TMP_MARK", "OutputError", "ParquetSink", "RunOutputs", "check_output_dir", "parquet_options"]

ID_FIELDS = list(records.ID_FIELDS)
_STRING_COLUMNS = ["hook", "layer", "canonical", "phase", "kind", "slot", "dtype", "split"]
#: Default memory budget of each file's buffer (``output.row_group_mb``): tables are buffered up to
#: this many bytes so that short steps do not make tiny row groups, then written as one row group.
ROW_GROUP_BYTES = 64 << 20


def parquet_options(schema: pa.Schema) -> dict:
    """Compression and dictionary-encoded columns of every file the runner writes."""
    return {"compression": "snappy", "use_dictionary": [c for c in _STRING_COLUMNS if c in schema.names]}


def schema_fingerprint(schema: pa.Schema) -> str:
    """A short hash of a file's columns and types (not its metadata), kept in the manifest: a
    sweep's loader reads one footer per distinct fingerprint instead of one per file."""
    return hashlib.sha256(schema.remove_metadata().serialize().to_pybytes()).hexdigest()[:16]


class ParquetSink:
    """One parquet file streamed into a temporary sibling, made durable by ``finish`` (``commit``
    renames it into place).

    At most ``row_group_bytes`` of rows wait in memory: a run's memory does not grow with its
    number of steps, whatever it captures. The file is created with its first row group, or by
    ``finish``: a file a run leaves out (``RunOutputs.OPTIONAL`` without rows) is never created
    (opening and removing nine of them was a sixth of an attach block's CPU time).
    """

    def __init__(self, path: Path, schema: pa.Schema, metadata: dict[str, str],
                 row_group_bytes: int = ROW_GROUP_BYTES) -> None:
        self.path = path
        self.row_group_bytes = row_group_bytes
        self.tmp = tmp_path(path)
        self.schema = schema.with_metadata(metadata)
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._writer: pq.ParquetWriter | None = None

    def _opened(self) -> pq.ParquetWriter:
        """The writer of the temporary file, created at the first call."""
        if self._writer is None:
            try:
                with naming(self.path):  # the file the user knows, not its temporary name
                    self._writer = pq.ParquetWriter(self.tmp, self.schema, **parquet_options(self.schema))
            except BaseException:
                self.tmp.unlink(missing_ok=True)
                raise
        return self._writer

    def write(self, table: pa.Table) -> None:
        """Queue ``table``; full row groups are written as the buffer fills."""
        self.rows += table.num_rows
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        if self._pending_bytes >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            writer = self._opened()
            with naming(self.path):
                writer.write_table(pa.concat_tables(self._pending))
            self._pending, self._pending_bytes = [], 0

    def finish(self, drop: Sequence[str] = ()) -> int:
        """Write what is buffered, close and fsync the temporary file; return its size in bytes.

        ``drop``: columns left out of the file, for a small file whose columns are known only at the
        end (``steps.parquet``'s measures): left out of the rows still buffered when none was written
        yet (the file is written once), else the file is written again without them.
        """
        if drop and self._writer is None:
            self.schema = pa.schema([f for f in self.schema if f.name not in drop], metadata=self.schema.metadata)
            self._pending = [table.drop_columns(list(drop)) for table in self._pending]
            drop = ()
        self._flush()
        writer, self._writer = self._opened(), None
        with naming(self.path):
            writer.close()
            size = sync_file(self.tmp).st_size
        return self._without(drop) if drop else size

    def _without(self, names: Sequence[str]) -> int:
        """The finished temporary file written again without columns ``names``; its size."""
        with pq.ParquetFile(self.tmp) as written:  # not pq.read_table: its dataset module imports pandas
            table = written.read().drop_columns(list(names))
        self.schema = table.schema
        with naming(self.path):
            pq.write_table(table, self.tmp, **parquet_options(self.schema))
            return sync_file(self.tmp).st_size

    def abort(self) -> None:
        """Drop the temporary file; the final path is never created.

        Closing may fail again (a full disk fails the footer too), and so may the unlink (a disk
        turned read-only): those errors are dropped, the one that made the run abort is the one to
        report; a temporary file left behind is removed by the next claim of the directory.
        """
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)


class RunOutputs:
    """Context manager over one run directory: commits every file and the manifest, or none.

    Without ``claim`` it claims ``out_dir`` itself (``claim_run_dir(out_dir, overwrite)``) and
    releases it on exit; with one (made before Hydra wrote ``.hydra/``) the caller releases it.
    ``extra`` is merged into the manifest (e.g. seed, config hash of the plan, entry lifetimes).
    After an interrupt, ``committed`` tells whether the run had completed before it.

    Example:
        >>> with RunOutputs(out_dir, config_yaml, overrides) as outputs:
        ...     outputs.write_step(0, captures, loss=0.7, wall_time_s=0.1)
    """

    FILES = {**TABLE_SCHEMAS, **RUN_TOTAL_SCHEMAS}
    #: Files left out of the run (not created, not listed) when they receive no row.
    OPTIONAL = frozenset({TENSORS, *RUN_TOTAL_SCHEMAS})
    #: Files written once, at the end of the run, from hook entries' totals (``HookType.tables``).
    RUN_TOTALS = RUN_TOTAL_SCHEMAS
    #: The manifest's own keys, which ``extra`` cannot replace.
    MANIFEST_KEYS = frozenset({"complete", "schema_version", "run_id", "config_hash", "overrides", "files",
                               "replaced", "versions", "finished"})

    def __init__(self, out_dir: Path, config_yaml: str, overrides: Sequence[str] = (),
                 row_group_bytes: int = ROW_GROUP_BYTES, overwrite: bool = False, *,
                 claim: RunClaim | None = None, extra: dict | None = None,
                 measures: Sequence[str] = STEP_METRICS) -> None:
        self.out_dir = Path(out_dir)
        if claim is not None and claim.out_dir.resolve() != self.out_dir.resolve():
            raise ValueError(f"the claim is for '{claim.out_dir}', not '{self.out_dir}'")
        clashes = sorted(self.MANIFEST_KEYS & set(extra or {}))
        if clashes:
            raise ValueError(f"extra manifest keys {clashes} would replace the manifest's own")
        self.row_group_bytes = row_group_bytes
        self.overwrite = overwrite
        self.config_yaml = config_yaml
        self.config_hash = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
        self.overrides = list(overrides)
        self.extra = dict(extra or {})
        self.claim = claim
        self._owns_claim = claim is None
        self._sinks: dict[str, ParquetSink] = {}
        self._writer: BackgroundWriter | None = None
        #: The per-step measures a step may give (``steps.parquet``'s possible measure columns) ...
        self.measures = tuple(dict.fromkeys([*STEP_METRICS, *measures]))
        #: ... and those some step gave a value: the file's measure columns.
        self._measured: set[str] = set()

    @property
    def committed(self) -> bool:
        """Whether this run's manifest is in place (read from the directory, not remembered)."""
        return self.claim is not None and self.claim.committed

    def __enter__(self) -> RunOutputs:
        if self._owns_claim:
            self.claim = claim_run_dir(self.out_dir, self.overwrite)
        meta = {"schema_version": SCHEMA_VERSION, "config_hash": self.config_hash, "run_id": self.claim.run_id}
        try:
            for name, schema in {**self.FILES, STEPS: steps_schema(self.measures)}.items():
                self._sinks[name] = ParquetSink(self.out_dir / name, schema, meta, self.row_group_bytes)
            self._writer = BackgroundWriter(max_bytes=self.row_group_bytes)  # one memory budget for both
        except BaseException:
            self._abandon()
            if self._owns_claim:
                self.claim.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                self._abandon()
                return
            try:
                self._commit()
            except BaseException:
                self._abandon()
                raise
        finally:
            if self._owns_claim:
                self.claim.release()

    def _commit(self) -> None:
        self._writer.close()
        self.claim.verify()
        files, temps = {}, {}
        for name, sink in self._sinks.items():
            if sink.rows == 0 and name in self.OPTIONAL:
                sink.abort()
                continue
            # a measure no step gave is not a column of NaN
            size = sink.finish([m for m in self.measures if m not in self._measured] if name == STEPS else ())
            files[name] = {"rows": sink.rows, "bytes": size, "schema": schema_fingerprint(sink.schema)}
            temps[name] = sink.tmp
        temps[CONFIG] = stage_config(self.out_dir, self.config_yaml)
        commit(self.out_dir, temps, {
            "complete": True,
            "schema_version": SCHEMA_VERSION,
            "run_id": self.claim.run_id,
            "config_hash": self.config_hash,
            "overrides": self.overrides,
            "files": files,
            "versions": versions(),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **self.extra,
        })

    def _abandon(self) -> None:
        """After a failure: drop the temporary files and undo an unfinished commit (never a finished one).

        A file system that fails the clean-up too leaves it to the next claim of the directory;
        the error that made the run fail is the one reported.
        """
        if self._writer is not None:
            self._writer.close(discard=True)
        for sink in self._sinks.values():
            sink.abort()
        try:
            recover(self.out_dir)
        except OSError:
            pass

    def write_rows(self, name: str, table: pa.Table) -> None:
        """Append rows an earlier attempt of this run wrote (``runner.store.resume``) to file ``name``."""
        if name == STEPS:
            self._measured.update(m for m in self.measures if m in table.column_names and _has_value(table[m]))
        self._writer.submit(lambda: self._sinks[name].write(table.cast(self._sinks[name].schema)))

    def submit(self, job) -> None:
        """Run ``job`` on the writer thread after what is queued (a live logger's line of a written step)."""
        self._writer.submit(job)

    def write_table(self, name: str, columns: dict[str, list]) -> None:
        """Append an entry's run totals (``HookType.tables``) to file ``name`` of ``RUN_TOTALS``."""
        if name not in self.RUN_TOTALS:
            raise ValueError(f"no run-total file '{name}'; valid: {', '.join(self.RUN_TOTALS)}")
        schema = self.RUN_TOTALS[name]
        table = pa.Table.from_pydict({column: columns[column] for column in schema.names}, schema=schema)
        self._writer.submit(lambda: self._sinks[name].write(table))

    def flush_partial(self) -> dict[str, Path]:
        """After an interruption, before the exit: write what is queued and close the temporary
        files, readable as they are; return the per-step ones by name (``runner.store.resume`` keeps
        their rows; run totals such as ``units.parquet`` are written at the end, from the entries'
        ``run_state``, which the resume point keeps)."""
        self._writer.close()
        for sink in self._sinks.values():
            sink.finish()
        return {name: sink.tmp for name, sink in self._sinks.items() if name not in self.RUN_TOTALS}

    def write_step(self, step: int, captures: StepCaptures, loss: float | None, wall_time_s: float,
                   split: str = "train", peak_memory_bytes: int | None = None,
                   metrics: dict[str, float] | None = None) -> None:
        """Append one step: its statistics rows, its kept tensors and its ``steps`` row.

        ``split`` is ``train`` for a training (or measurement) step, ``eval`` for the eval passes
        run after training step ``step``. The tables are built and written on the background
        writer thread, overlapping the next step; ``captures`` must not be changed afterwards
        (``Recorder.drain`` hands over its lists). ``metrics`` fill ``STEP_METRICS`` columns (NaN in the steps
        without it); a measure no step gives is left out of the file.
        """
        unknown = sorted(set(metrics or {}) - set(self.measures))
        if unknown:
            raise ValueError(f"steps.parquet has no column {unknown}; the per-step measures are {list(self.measures)}")
        values = [float("nan") if (metrics or {}).get(name) is None else float(metrics[name]) for name in self.measures]
        self._measured.update(name for name, value in (metrics or {}).items() if value is not None)
        kept_bytes = sum(t.numel() * t.element_size() for t in captures.kept)
        self._writer.submit(lambda: self._write_step(step, captures, loss, wall_time_s, split, peak_memory_bytes,
                                                     values), nbytes=kept_bytes)

    def _write_step(self, step: int, captures: StepCaptures, loss: float | None, wall_time_s: float,
                    split: str, peak_memory_bytes: int | None, metrics: list[float]) -> None:
        n = len(captures)
        ids = _id_arrays(step, captures.columns, n)
        stats = [_from_numpy(captures.stats[c], STATS_SCHEMA.field(c).type) for c in STAT_COLUMNS]
        self._sinks[STATS].write(pa.Table.from_arrays(ids + stats, schema=STATS_SCHEMA))
        if captures.kept:
            rows = _from_numpy(np.asarray(captures.kept_rows), pa.int64())
            kept_ids = [col.take(rows) for col in ids]
            self._sinks[TENSORS].write(
                pa.Table.from_arrays(kept_ids + [_values_array(captures.kept)], schema=TENSORS_SCHEMA))
        self._sinks[STEPS].write(pa.Table.from_arrays(
            [_from_numpy(np.array([step]), pa.int64()), _column([split], pa.string()),
             _from_numpy(np.array([float("nan") if loss is None else loss]), pa.float64()),
             _from_numpy(np.array([wall_time_s]), pa.float64()), _from_numpy(np.array([n]), pa.int64()),
             pa.nulls(1, pa.int64()) if peak_memory_bytes is None
             else _from_numpy(np.array([peak_memory_bytes]), pa.int64()),
             *[_from_numpy(np.array([value]), pa.float64()) for value in metrics]],
            schema=self._sinks[STEPS].schema))


def write_tables(hooks, outputs: RunOutputs) -> None:
    """Hand every entry's run totals (``HookType.tables``, e.g. ``units.parquet``) to ``outputs``."""
    for hook in hooks:
        for name, columns in hook.tables().items():
            outputs.write_table(name, columns)


def _has_value(column: pa.ChunkedArray) -> bool:
    """Whether a float column holds a value that is neither null nor NaN."""
    return bool(pc.any(pc.invert(pc.is_nan(column))).as_py())


def _id_arrays(step: int, columns: dict[str, list], n: int) -> list[pa.Array]:
    out = [_from_numpy(np.full(n, step), pa.int64())]
    for field in ID_FIELDS[1:]:
        out.append(_column(columns[field.name], field.type))
    return out


def _values_array(tensors: list[torch.Tensor]) -> pa.ChunkedArray:
    """One zero-copy list chunk per tensor over its float32 buffer: no per-element Python work, no copy."""
    chunks = []
    for t in tensors:
        flat = t.reshape(-1).to(torch.float32).numpy()
        offsets = _from_numpy(np.array([0, flat.size]), pa.int64())
        chunks.append(pa.LargeListArray.from_arrays(offsets, _from_numpy(flat, pa.float32())))
    return pa.chunked_array(chunks, TENSORS_SCHEMA.field("tensor_values").type)


def _column(values: list, arrow_type: pa.DataType) -> pa.Array:
    """An identifier column (int64, string or list<int64>) built from its buffers, without ``pa.array``."""
    if arrow_type == pa.string():
        encoded = [b"" if v is None else v.encode() for v in values]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        valid = None if None not in values else pa.py_buffer(np.packbits(
            np.array([v is not None for v in values]), bitorder="little"))  # null where there is no value
        return pa.Array.from_buffers(pa.string(), len(encoded), [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])
    if pa.types.is_list(arrow_type):
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum([len(v) for v in values], out=offsets[1:])
        flat = np.fromiter((x for v in values for x in v), dtype=np.int64, count=int(offsets[-1]))
        return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
                                        _from_numpy(flat, arrow_type.value_type))
    return _from_numpy(np.asarray(values), arrow_type)


#: numpy dtypes of the Arrow types the runner writes from numpy arrays.
_NUMPY_OF = {pa.int64(): np.int64, pa.float64(): np.float64, pa.float32(): np.float32}


def _from_numpy(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A 1-D numpy array as an Arrow array, zero-copy: unlike ``pa.array`` it never imports pandas
    (``pa.array`` of an ndarray does, which costs the CLI most of a second)."""
    values = np.ascontiguousarray(values, dtype=_NUMPY_OF[arrow_type])
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def versions() -> dict[str, str]:
    """Python's and every package's version that a run's numbers depend on (the manifest keeps them; replay compares)."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    """``versions``, read from the packages' metadata once a process (3.7 ms, a fifth of an attach block's CPU):
    the code a run executes is what the process imported, whatever is installed after."""
    found = {"python": platform.python_version()}
    for pkg in ("torch", "torchvision", "pyarrow", "hydra-core", "omegaconf", "pandas", "hook-runner"):
        try:
            found[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            found[pkg] = "not installed"
    return found
