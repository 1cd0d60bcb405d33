"""Complete run directories written by hand, for the analysis side's tests: the files a run commits (each
in its schema from ``common.records``), its ``config.yaml`` and the manifest that makes the loaders trust it,
without a model or a forward pass; a sweep of them with its ``sweep.json``."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from common.records import (CONFIG, MANIFEST, RUN_TOTAL_SCHEMAS, SCHEMA_VERSION, STATS_SCHEMA, STEPS, STEPS_SCHEMA,
                            TENSORS_SCHEMA)
from runner.store.sweep_record import write_sweep

SCHEMAS = {"stats.parquet": STATS_SCHEMA, "tensors.parquet": TENSORS_SCHEMA, STEPS: STEPS_SCHEMA, **RUN_TOTAL_SCHEMAS}


def write_run(run_dir: Path, tables: Mapping[str, Sequence[dict]], overrides: Sequence[str] = (),
              config: Mapping | None = None) -> Path:
    """A complete run at ``run_dir``: each of ``tables`` (file name -> rows, a dict per row; a column a row
    leaves out is null) in its schema, ``config`` as its ``config.yaml`` and the manifest listing them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rows in tables.items():
        schema = SCHEMAS[name]
        table = pa.Table.from_pylist(list(rows), schema=schema)
        pq.write_table(table, run_dir / name)
        files[name] = {"rows": table.num_rows, "bytes": (run_dir / name).stat().st_size}
    (run_dir / CONFIG).write_text(yaml.safe_dump(dict(config or {})))
    manifest = {"complete": True, "schema_version": SCHEMA_VERSION, "run_id": run_dir.name,
                "overrides": list(overrides), "files": {**files, CONFIG: {}}}
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    return run_dir


def write_sweep_record(sweep: Path, jobs: Sequence[tuple[Sequence[str], str]]) -> None:
    """``sweep.json`` of ``jobs`` (their overrides and state, ``ok`` for a run written at ``sweep/NUM``)."""
    write_sweep(sweep, [{"num": num, "overrides": list(overrides), "state": state,
                         "error": None if state == "ok" else f"job {num} ended {state}", "run_dir": str(num)}
                        for num, (overrides, state) in enumerate(jobs)])
