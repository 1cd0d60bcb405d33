"""Record batches into one pandas DataFrame, written column by column as the batches arrive.

``Table.to_pandas`` needs the whole table in memory beside the frame it builds, and turns every
list into one numpy array per row (1.2 M small arrays for a 1,000-job sweep's ``tensor_shape``).
Here the batches of a sweep's small files are gathered into groups of ``GROUP_ROWS`` rows, each
group copied into preallocated numpy columns and dropped, so the peak is the frame plus a few
groups. Text and shapes become categoricals, one small code per row and each distinct value
once: text with the values the rows hold, sorted (groupby and legends order as plain strings would), shapes as
tuples such as ``(2, 64, 8, 8)``. Numbers stay numbers; an integer column with a missing value
becomes float64 with NaN, as pyarrow converts it. Other types (``tensor_values``' float lists)
are left to pyarrow's own conversion.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: Rows gathered from a sweep's small files before they are converted together: the per-column
#: work then runs once per 4,096 rows, not once per file. A group is in memory twice beside the
#: frame (its batches, then combined), and a small file's batch holds a few kB of buffers and
#: dictionaries whatever its rows: groups of 16,384 rows held 11 MiB of Arrow memory at the peak
#: of a 10,000-job sweep's load (a 14 MiB frame), of 4,096 rows 2.4 to 5 MiB, of 1,024 rows 1.6 MiB.
#: Of 1,024 rows, a 1,000-job sweep of 1,200-row files was 1,000 groups of one file each: building
#: the frame from the scan's batches took 91 ms of CPU for 4 columns and 1.09 s for all of them,
#: against 51 ms and 0.60 s in groups of 4,096 rows (its peak: 1.29 of the frame, 1.41-1.50 before).
GROUP_ROWS = 1 << 12
#: ... but a group of more than ``SMALL_BATCHES`` files' batches closes at ``SMALL_GROUP_ROWS``, as all
#: groups did: 4,096 rows of a 2,000-job sweep of tiny jobs held 2.26 times the frame at the peak,
#: 1,024 rows 1.66 (each small batch's buffers and dictionaries, whatever its rows).
SMALL_BATCHES, SMALL_GROUP_ROWS = 4, 1 << 10


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.empty(capacity, dtype=array.dtype)
    grown[:len(array)] = array
    return grown


class _Numbers:
    """An integer, float or bool column."""

    def __init__(self, kind: pa.DataType, capacity: int) -> None:
        self.out = np.empty(capacity, dtype=kind.to_pandas_dtype())

    def grow(self, capacity: int) -> None:
        self.out = _grown(self.out, capacity)

    def put(self, at: int, column: pa.Array) -> None:
        if column.null_count and self.out.dtype.kind != "f":  # pandas' missing integer or bool: NaN or None
            self.out = self.out.astype(np.float64 if self.out.dtype.kind in "iu" else object)
        self.out[at:at + len(column)] = column.to_numpy(zero_copy_only=False)

    def done(self, rows: int) -> np.ndarray:
        return self.out[:rows]


class _Labels:
    """A string column (plain or dictionary-encoded) as a categorical; ``None`` is missing.

    Codes start as int8 and widen when the distinct values outgrow them.
    """

    text = True

    def __init__(self, capacity: int) -> None:
        self.codes = np.empty(capacity, dtype=np.int8)
        self.index: dict = {}
        #: The last group's dictionary and its codes: the next group of a sweep's files mostly has the same one.
        self.last: tuple[pa.Array, np.ndarray] | None = None

    def grow(self, capacity: int) -> None:
        self.codes = _grown(self.codes, capacity)

    def put(self, at: int, column: pa.Array) -> None:
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        indices = column.indices.fill_null(len(column.dictionary)) if column.null_count else column.indices
        if self.last is None or not self.last[0].equals(column.dictionary):
            self.last = (column.dictionary, self.local(column.dictionary.to_pylist()))
        self.codes[at:at + len(column)] = self.last[1][indices.to_numpy()]

    def local(self, values: list) -> np.ndarray:
        """Codes of this group's distinct ``values`` (``None``: missing), then -1 for a missing row."""
        codes = [-1 if v is None else self.index.setdefault(v, len(self.index)) for v in values] + [-1]
        if len(self.index) > np.iinfo(self.codes.dtype).max:
            self.codes = self.codes.astype(np.min_scalar_type(-len(self.index)))
        return np.array(codes, dtype=self.codes.dtype)

    def done(self, rows: int) -> pd.Categorical:
        """The categorical of the first ``rows``: the values they hold (a file's dictionary may
        hold more than its filtered rows), sorted."""
        codes = self.codes[:rows]
        held = np.zeros(len(self.index) + 1, dtype=bool)
        held[codes] = True  # a missing row's -1 marks the last place, which is no value
        values = list(self.index)
        order = sorted((i for i in range(len(values)) if held[i]), key=values.__getitem__)
        rank = np.full(len(values) + 1, -1, dtype=self.codes.dtype)
        rank[order] = np.arange(len(order))
        categories = pd.Index([values[i] for i in order], dtype=None if self.text else object, tupleize_cols=False)
        return pd.Categorical.from_codes(rank[codes], categories=categories)


class _Shapes(_Labels):
    """A list-of-integers column (``tensor_shape``) as a categorical of tuples."""

    text = False

    def put(self, at: int, column: pa.Array) -> None:
        # Each shape as one integer: its length (-1 if missing), then each size folded in by
        # factorizing (key so far, next size) pairs, so the key never grows past the row count.
        offsets = column.offsets.to_numpy()
        flat = column.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False)
        offsets = offsets - offsets[0]
        lengths = np.diff(offsets)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        key = pd.factorize(np.where(valid, lengths, -1))[0].astype(np.int64)
        for dim in range(int(lengths.max(initial=0))):
            has = lengths > dim
            size = np.full(len(column), -1, dtype=np.int64)
            size[has] = flat[offsets[:-1][has] + dim]
            codes, sizes = pd.factorize(size)
            key = pd.factorize(key * len(sizes) + codes)[0].astype(np.int64)
        first = np.unique(key, return_index=True)[1]  # one row of each distinct shape, in key order
        shapes = [tuple(flat[offsets[i]:offsets[i + 1]].tolist()) if valid[i] else None for i in first]
        self.codes[at:at + len(column)] = self.local(shapes)[key]


class _Arrow:
    """Any other type: its chunks, converted by pyarrow at the end."""

    def __init__(self, kind: pa.DataType) -> None:
        self.kind, self.chunks = kind, []

    def grow(self, capacity: int) -> None:
        pass

    def put(self, at: int, column: pa.Array) -> None:
        self.chunks.append(column)

    def done(self, rows: int) -> pd.Series:
        return pa.chunked_array(self.chunks, type=self.kind).to_pandas()


def _sink(kind: pa.DataType, capacity: int) -> _Numbers | _Labels | _Arrow:
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return _Numbers(kind, capacity)
    if pa.types.is_string(value) or pa.types.is_large_string(value):
        return _Labels(capacity)
    if pa.types.is_list(kind) and pa.types.is_integer(kind.value_type):
        return _Shapes(capacity)
    return _Arrow(kind)


def _groups(batches: Iterable[tuple[pa.RecordBatch, int]], schema: pa.Schema
            ) -> Iterator[tuple[list[pa.Array], np.ndarray]]:
    """``batches`` gathered into groups of about ``GROUP_ROWS`` rows (``SMALL_GROUP_ROWS`` of many small
    batches): each group's columns, and
    the file index of each of its rows."""
    group: list[pa.RecordBatch] = []
    files: list[np.ndarray] = []
    rows = 0
    for batch, file in itertools.chain(batches, [(None, -1)]):
        if batch is not None and batch.num_rows:
            group.append(batch)
            files.append(np.full(batch.num_rows, file, dtype=np.int32))
            rows += batch.num_rows
        if group and (rows >= GROUP_ROWS or batch is None or (len(group) > SMALL_BATCHES and rows >= SMALL_GROUP_ROWS)):
            columns = pa.Table.from_batches(group, schema=schema).combine_chunks().columns
            rows_files = np.concatenate(files)
            group, files, rows = [], [], 0  # the batches are freed: only the combined copy is left
            yield [column.chunk(0) for column in columns], rows_files
            # The group's Arrow memory is free now: give it back (mimalloc, pyarrow's default,
            # keeps freed pages, and the load's peak would grow by all the scan had in flight).
            del columns
            pa.default_memory_pool().release_unused()


def to_frame(batches: Iterable[tuple[pa.RecordBatch, int]], schema: pa.Schema, capacity: int
             ) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows of ``batches`` (each with the index of the file it came from) as a DataFrame, and
    that index per row. ``capacity`` is the expected number of rows (e.g. before a filter): the
    columns are allocated for it once, and grow if there are more."""
    sinks = [_sink(field.type, capacity) for field in schema]
    files = np.empty(capacity, dtype=np.int32)
    rows = 0
    for columns, group_files in _groups(batches, schema):
        if rows + len(group_files) > capacity:
            capacity = max(2 * capacity, rows + len(group_files))
            files = _grown(files[:rows], capacity)
            for sink in sinks:
                sink.grow(capacity)
        for sink, column in zip(sinks, columns):
            sink.put(rows, column)
        files[rows:rows + len(group_files)] = group_files
        rows += len(group_files)
    frame = {}
    for name in schema.names:  # each sink dropped once its column is built: no second copy of all
        column = sinks.pop(0).done(rows)
        frame[name] = column.copy() if isinstance(column, np.ndarray) and rows < capacity else column
    return pd.DataFrame(frame, copy=False), (files[:rows].copy() if rows < capacity else files)
