"""``units.parquet``: one row per (entry, layer, call, unit) of a ``units`` entry's run totals.

The columns hold what merges exactly (counts, Chan's ``(count, mean, M2)``, min, max, sketch
bucket counts, top-k candidates, sums of outer products), not only final values, so that
``runner.analysis.load_units`` merges the tables of a sharded sweep into the one-job table.
"""
from __future__ import annotations

import pyarrow as pa

from hooks.units import UNIT_COLUMNS

_F64, _I64 = pa.float64(), pa.int64()
_TYPES = {"hook": pa.string(), "layer": pa.string(), "call": _I64, "unit": _I64, "count": _I64, "mean": _F64,
          "m2": _F64, "min": _F64, "max": _F64, "threshold": _F64, "above": _I64, "top_k": _I64, "relative_error": _F64,
          "sketch_low": _F64, "sketch_high": _F64, "sketch_index": pa.list_(pa.int32()),
          "sketch_count": pa.list_(_I64), "top_value": pa.list_(_F64), "top_sample": pa.list_(_I64),
          "top_position": pa.list_(_I64), "bottom_value": pa.list_(_F64), "bottom_sample": pa.list_(_I64),
          "bottom_position": pa.list_(_I64), "position_shape": pa.list_(_I64), "second_moment": pa.list_(_F64)}
UNITS_SCHEMA = pa.schema([pa.field(name, _TYPES[name]) for name in UNIT_COLUMNS])


def units_table(columns: dict[str, list]) -> pa.Table:
    """The columns a ``units`` entry hands over (``HookType.tables``) as a table of ``UNITS_SCHEMA``."""
    return pa.Table.from_pydict({name: columns[name] for name in UNIT_COLUMNS}, schema=UNITS_SCHEMA)
