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

from common.records import UNIT_EXAMPLES, UNIT_INPUTS, UNITS
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


def load_unit_examples(path: str | Path, on_corrupt: str = "error") -> pd.DataFrame:
    """The kept top examples of the run at ``path`` (``unit_examples.parquet``), or of every run under it
    merged like ``load_units``' top samples: per unit, the first ``examples`` of all parts in the top
    order, ``rank`` 0 the largest; ``map`` as ``[h, w]`` float32 arrays (``None`` for a unit without
    one). Rows in the order the first run recorded its layers (the model's call order)."""
    tables = [pq.read_table(file) for run in run_dirs(path, on_corrupt) for _, file in rank_files(run, UNIT_EXAMPLES)]
    if not tables:
        raise FileNotFoundError(f"no run at or under '{path}' wrote {UNIT_EXAMPLES} (a units entry with examples > 0 "
                                f"writes it)")
    frame = pa.concat_tables(tables).to_pandas()
    key = frame[KEY].astype(str).agg("/".join, axis=1)
    unit = pd.factorize(key)[0]  # first-seen order: the first part's
    keep = frame.groupby(unit)["rank"].transform("max").to_numpy() + 1  # what each part kept
    order = ranked(frame.value.to_numpy(), frame["sample"].to_numpy(), True, unit)
    frame = frame.iloc[order].assign(rank=lambda rows: rows.groupby(unit[order]).cumcount().to_numpy())
    frame = frame[frame["rank"].to_numpy() < keep[order]].reset_index(drop=True)
    frame["map"] = [np.asarray(m, np.float32).reshape(s) if len(s) else None for m, s in zip(frame["map"], frame.map_shape)]
    return frame


def load_unit_inputs(path: str | Path, on_corrupt: str = "error") -> dict[tuple[str, int], np.ndarray]:
    """The inputs the runs at or under ``path`` kept for their top examples (``unit_inputs.parquet``), by
    ``(hook, sample)``: an image as ``[C, H, W]`` float32, token ids as 1-D int64."""
    found = {}
    for run in run_dirs(path, on_corrupt):
        for _, file in rank_files(run, UNIT_INPUTS):
            for row in pq.read_table(file).to_pylist():
                values = (np.asarray(row["input"], np.float32) if row["input"] else np.asarray(row["input_ids"], np.int64))
                found[(row["hook"], row["sample"])] = values.reshape(row["input_shape"])
    return found


def recorded_layers(run_dir: str | Path) -> list[str]:
    """The layers of the run's ``units.parquet`` in the order it recorded them: the model's call order."""
    return list(dict.fromkeys(pq.read_table(rank_files(Path(run_dir), UNITS)[0][1], columns=["layer"])
                              .column("layer").to_pylist()))


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
