"""``units.parquet`` as a table: the columns a ``units`` entry hands over (``HookType.tables``) in
the schema ``common.records.UNITS_SCHEMA`` declares."""
from __future__ import annotations

import pyarrow as pa

from common.records import UNIT_COLUMNS, UNITS_SCHEMA


def units_table(columns: dict[str, list]) -> pa.Table:
    """The columns a ``units`` entry hands over (``HookType.tables``) as a table of ``UNITS_SCHEMA``."""
    return pa.Table.from_pydict({name: columns[name] for name in UNIT_COLUMNS}, schema=UNITS_SCHEMA)
