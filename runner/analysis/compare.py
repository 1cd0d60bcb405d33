"""Whether two runs wrote the same tables, and where not: what ``replay=RUN_DIR`` prints.

Each table (``stats``, ``tensors``, ``steps``) is compared row by row, value by value (NaN equals
NaN; a list cell equals one of the same length and values), except the columns that measure the
machine rather than the computation (``NOT_COMPARED``). A table differs in its row count, its
columns, or its values; for values the first differing rows are named by their identifier columns,
and each differing numeric column by its largest absolute difference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from common.records import TABLES

#: Wall time and peak memory of a step: measures of the machine and its load, never reproducible.
NOT_COMPARED = ("wall_time_s", "peak_memory_bytes")
#: Columns that say which record a row is (shown for the first differing rows).
_ROW_LABEL = ("step", "split", "layer", "kind", "slot", "call")
_FIRST_ROWS = 3


@dataclass
class TableComparison:
    """One table of two runs: ``equal``, or ``problems`` (one phrase each) saying where it differs."""

    name: str
    rows: int | None  #: the stored run's rows; ``None`` when neither run wrote the table
    problems: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.rows is None:
            return f"{self.name}: equal (written by neither run)"
        if self.equal:
            return f"{self.name}: equal ({self.rows} rows)"
        return f"{self.name}: differs: " + "; ".join(self.problems)


def compare_runs(stored: str | Path, replayed: str | Path) -> list[TableComparison]:
    """Compare every table of run directory ``replayed`` with the same table of ``stored``."""
    return [compare_table(Path(stored) / name, Path(replayed) / name) for name in TABLES]


def compare_table(stored: Path, replayed: Path) -> TableComparison:
    """Compare one parquet file of two runs (a file neither run wrote is equal)."""
    if not stored.exists() or not replayed.exists():
        if stored.exists() == replayed.exists():
            return TableComparison(stored.name, None)
        missing = "the replay" if stored.exists() else "the stored run"
        return TableComparison(stored.name, None, [f"{missing} has no {stored.name}"])
    a, b = (_frame(path) for path in (stored, replayed))
    result = TableComparison(stored.name, len(a))
    only = [f"{c} only in the stored run" for c in a.columns if c not in b.columns]
    only += [f"{c} only in the replay" for c in b.columns if c not in a.columns]
    result.problems += [f"column {text}" for text in only]
    if len(a) != len(b):
        result.problems.append(f"{len(a)} rows stored, {len(b)} replayed (compared: the first {min(len(a), len(b))})")
    n = min(len(a), len(b))
    columns = [c for c in a.columns if c in b.columns]
    differing = {c: _differs(a[c].to_numpy()[:n], b[c].to_numpy()[:n]) for c in columns}
    differing = {c: mask for c, mask in differing.items() if mask.any()}
    for column, mask in differing.items():
        diff = _max_abs_difference(a[column].to_numpy()[:n][mask], b[column].to_numpy()[:n][mask])
        result.problems.append(f"column {column}: {int(mask.sum())} of {n} rows"
                               + (f", max abs difference {diff:.6g}" if diff is not None else ""))
    if differing:
        rows = np.flatnonzero(np.logical_or.reduce(list(differing.values())))[:_FIRST_ROWS]
        result.problems.append("first differing rows: " + ", ".join(_label(a, int(r)) for r in rows))
    return result


def _frame(path: Path) -> pd.DataFrame:
    frame = pq.read_table(path).to_pandas()
    return frame.drop(columns=[c for c in NOT_COMPARED if c in frame.columns])


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: whether the two cells differ (NaN equals NaN; list cells compared as arrays)."""
    if a.dtype == object or b.dtype == object:
        return np.array([not _same(x, y) for x, y in zip(a, b)], dtype=bool)
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        return ~((a == b) | (np.isnan(a) & np.isnan(b)))
    return a != b


def _same(x, y) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return False
        nan = np.isnan(x) & np.isnan(y) if x.dtype.kind == "f" and y.dtype.kind == "f" else False
        return bool(np.all((x == y) | nan))
    return x == y or (x != x and y != y)  # NaN == NaN


def _max_abs_difference(a: np.ndarray, b: np.ndarray) -> float | None:
    """The largest ``|a - b|`` over numeric cells (lists elementwise, where the lengths agree)."""
    pairs = zip(a, b) if a.dtype == object else [(a, b)]
    found = None
    for x, y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype.kind not in "iuf" or y.dtype.kind not in "iuf" or not x.size:
            continue
        with np.errstate(invalid="ignore"):
            value = float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
        found = value if found is None else max(found, value)
    return found


def _label(frame: pd.DataFrame, row: int) -> str:
    parts = [f"{c}={frame[c].iloc[row]}" for c in _ROW_LABEL if c in frame.columns]
    return f"row {row} ({', '.join(parts)})"
