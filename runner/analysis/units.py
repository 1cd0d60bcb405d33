"""Reading ``units.parquet`` back: one run, or every job of a sweep merged into the one-job table.

``load_units(path)`` merges the rows of the same (hook, layer, call, unit) across jobs (the
shards of ``data.shard``) and across the ranks of a run under ``torch.distributed`` (each
rank's part, ``rank-N``, holds the table of its samples): counts, ``above`` and sketch buckets
add, min and max are the extremes, ``(count, mean, M2)`` fold with Chan's update, the top-k and
bottom-k candidates are re-ranked in the order they were kept (``common.unit_sketch.ranked``) and second moments add. Integers, extremes, sketches
and top-k sets come out exactly as one job writes them; means and variances to float64 rounding
(a different order of additions, ~1e-15 relative). Derived columns: ``variance`` (population:
M2 / count), ``std``, ``fraction_above`` (``above / count``; a unit's dead fraction is one minus it).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from common.records import UNITS
from common.unit_sketch import SketchGrid, chan_merge, ranked
from runner.analysis.load import run_dirs
from runner.store.ranks import rank_files

KEY = ["hook", "layer", "call", "unit"]
_TOP = ("top_value", "top_sample", "top_position")
_BOTTOM = ("bottom_value", "bottom_sample", "bottom_position")


def load_units(path: str | Path, on_corrupt: str = "error") -> pd.DataFrame:
    """The unit statistics of the run at ``path``, or of every run under it merged (a sharded sweep),
    each run's ranks merged too; ``on_corrupt`` as for ``load_stats``.

    Example:
        >>> units = load_units("outputs/multirun/2026-11-26/10-00-00")
        >>> units[units.layer == "layer3"].nlargest(5, "mean")[["unit", "mean", "top_sample"]]
    """
    tables = [_read(file) for run in run_dirs(path, on_corrupt) for _, file in rank_files(run, UNITS)]
    if not tables:
        raise FileNotFoundError(f"no run at or under '{path}' wrote {UNITS} (add a units entry: hooks=units)")
    frame = pa.concat_tables(tables).to_pandas()
    merged = frame if len(tables) == 1 else pd.DataFrame([_merge(group) for _, group in frame.groupby(KEY, sort=False)])
    merged = merged.sort_values(KEY, ignore_index=True)
    merged["variance"] = merged.m2 / merged["count"]
    merged["std"] = np.sqrt(merged.variance)
    merged["fraction_above"] = merged.above / merged["count"]
    return merged


def _read(file: Path) -> pa.Table:
    """One ``units.parquet``; one whose sketches use another bucket mapping (written by an earlier
    version) is refused: its quantiles would be read with the wrong buckets."""
    table = pq.read_table(file)
    mappings = set(table.column("sketch_mapping").to_pylist()) if "sketch_mapping" in table.column_names else {None}
    if mappings != {SketchGrid.MAPPING}:
        raise ValueError(f"'{file}' holds quantile sketches of another bucket mapping ({sorted(map(str, mappings))}, "
                         f"expected '{SketchGrid.MAPPING}'): written by an earlier version; run it again")
    return table


def _merge(rows: pd.DataFrame) -> dict:
    """One unit's rows of several jobs as the row one job over all their samples writes."""
    first = rows.iloc[0]
    out = first.to_dict()
    n, mean, m2 = 0, 0.0, 0.0
    for row in rows.itertuples(index=False):
        n, mean, m2 = (row.count, row.mean, row.m2) if n == 0 else chan_merge(n, mean, m2, row.count, row.mean,
                                                                              row.m2)
    out.update(count=n, mean=mean, m2=m2, min=rows["min"].min(), max=rows["max"].max(), above=rows.above.sum())
    sketch = {}
    for index, count in zip(np.concatenate(rows.sketch_index.to_list()), np.concatenate(rows.sketch_count.to_list())):
        sketch[index] = sketch.get(index, 0) + count
    out["sketch_index"] = np.array(sorted(sketch), dtype=np.int32)
    out["sketch_count"] = np.array([sketch[i] for i in out["sketch_index"]], dtype=np.int64)
    for names, largest in ((_TOP, True), (_BOTTOM, False)):
        values, samples, positions = (np.concatenate(rows[name].to_list()) for name in names)
        order = ranked(values, samples, largest)[:int(first.top_k)]
        out.update(zip(names, (values[order], samples[order], positions[order])))
    if len(first.second_moment):
        out["second_moment"] = np.sum(np.stack(rows.second_moment.to_list()), axis=0)
    return out


def unit_quantiles(units: pd.DataFrame, qs: list[float]) -> pd.DataFrame:
    """Each unit's ``qs`` quantiles from its sketch: the order statistic of rank ``floor(q (count - 1))``
    (``numpy.quantile(method="lower")``) within relative error ``relative_error`` for magnitudes in
    ``[sketch_low, sketch_high]``, and within ``sketch_low`` absolute below it. Columns ``q0.5`` etc."""
    out = units[KEY].copy()
    cumulative = [np.cumsum(counts) for counts in units.sketch_count]
    layouts = units.groupby(["relative_error", "sketch_low", "sketch_high"]).indices  # one grid per layout
    for q in qs:
        ranks = np.floor(q * (units["count"].to_numpy() - 1))
        buckets = np.array([index[np.searchsorted(cum, rank, side="right")]
                            for index, cum, rank in zip(units.sketch_index, cumulative, ranks)], dtype=np.int64)
        values = np.empty(len(units))
        for layout, rows in layouts.items():
            values[rows] = SketchGrid(*layout).value(buckets[rows])
        out[f"q{q:g}"] = np.clip(values, units["min"].to_numpy(), units["max"].to_numpy())
    return out


def layer_second_moment(units: pd.DataFrame, layer: str, hook: str | None = None, call: int = 0) -> np.ndarray:
    """The layer's ``E[x x^T]`` over all its values (units of ``second_moment: true`` entries); the covariance
    is this minus the outer product of the means."""
    rows = units[(units.layer == layer) & (units.call == call) & ((units.hook == hook) if hook else True)]
    if rows.empty or not len(rows.second_moment.iloc[0]):
        raise ValueError(f"no second moment of layer '{layer}' (the units entry needs second_moment: true)")
    return np.stack(rows.sort_values("unit").second_moment.to_list()) / rows["count"].iloc[0]
