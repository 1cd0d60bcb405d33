"""The answer of a ``store`` entry: the shards, samples and bytes each layer's activation store holds,
and where (``common.store_format``: each store's ``store.json`` lists its complete shards).

The stores are found under the entry's ``path`` as the run's saved config names it (relative to the
directory the command ran in); a pass that wrote on into a killed pass's store counts its shards too.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from common.store_format import MANIFEST, read_store_manifest
from runner.analysis.answers import Answer
from common.run_config import saved_config_path


def store_table(path: str | Path) -> pd.DataFrame:
    """One row per store (a layer's, or a rank's part of it) under ``path``: ``layer``, ``store`` (its
    directory), ``dtype``, ``shards``, ``samples``, ``bytes`` (the shard files'), ``first`` and ``last``
    sample id, ``complete``; in the order of the directories' names."""
    rows = []
    for found in sorted({*Path(path).glob(f"*/{MANIFEST}"), *Path(path).glob(f"*/rank-*/{MANIFEST}")}):
        manifest = read_store_manifest(found.parent)
        shards = manifest["shards"]
        size = sum((found.parent / s["file"]).stat().st_size for s in shards)
        rows.append((manifest["layer"], str(found.parent), manifest["dtype"], len(shards),
                     sum(int(s["rows"]) for s in shards), size, shards[0]["first"] if shards else None,
                     shards[-1]["last"] if shards else None, bool(manifest.get("complete"))))
    return pd.DataFrame(rows, columns=["layer", "store", "dtype", "shards", "samples", "bytes", "first", "last",
                                       "complete"])


def store_answer(run_dir: Path, entry: str) -> Answer | None:
    """Per store of the entry: its shards, samples and bytes and its directory; one line saying where
    the entry's path is when it holds no store (the run ran elsewhere, or the stores were moved)."""
    where = OmegaConf.load(saved_config_path(run_dir)).hooks[entry].path
    table = store_table(where)
    if table.empty:
        return Answer([f"no store under {where} (relative to the directory the run ran in)"], table)
    lines = [f"{row.layer}: {row.shards} shard(s), {row.samples:,} samples (ids {row.first}..{row.last}), "
             f"{_size(row.bytes)} of {row.dtype} in {row.store}{'' if row.complete else ' (not complete)'}"
             for row in table.itertuples()]
    total = f"wrote {table.shards.sum()} shard(s), {_size(table.bytes.sum())} under {where}"
    return Answer([total, *lines], table)


def _size(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} B"
