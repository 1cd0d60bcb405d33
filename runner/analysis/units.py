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
from common.ranks import rank_files

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
    tables = [with_named(pq.read_table(file)) for run in run_dirs(path, on_corrupt)
              for _, file in rank_files(run, UNIT_EXAMPLES)]
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
    return kept_inputs(path, on_corrupt)[0]


def load_unit_names(path: str | Path, on_corrupt: str = "error") -> dict[tuple[str, int], tuple[str, str]]:
    """The names the runs at or under ``path`` kept for their top examples' samples, by ``(hook, sample)``:
    ``(name, class)`` as the data give them (an ``imagefolder`` file's path under the folder and its class
    folder); a sample the data name nothing for is not in it (files written before the names were kept neither)."""
    return kept_inputs(path, on_corrupt, images=False)[1]


def kept_inputs(path: str | Path, on_corrupt: str = "error", images: bool = True
                ) -> tuple[dict[tuple[str, int], np.ndarray], dict[tuple[str, int], tuple[str, str]]]:
    """``load_unit_inputs``' and ``load_unit_names``' dicts from one read of each ``unit_inputs.parquet``;
    ``images=False`` leaves the image values unread (token ids and names only: what names a sample)."""
    columns = ["hook", "sample", "input_shape", "input_ids", "input_name", "input_class"] + (["input"] if images else [])
    inputs, names = {}, {}
    for run in run_dirs(path, on_corrupt):
        for _, file in rank_files(run, UNIT_INPUTS):
            parquet = pq.ParquetFile(file)
            for row in parquet.read(columns=[c for c in columns if c in parquet.schema_arrow.names]).to_pylist():
                key = (row["hook"], row["sample"])
                if row.get("input") or row["input_ids"]:  # a row may hold the sample's name alone
                    values = np.asarray(row["input"], np.float32) if row.get("input") else \
                        np.asarray(row["input_ids"], np.int64)
                    inputs[key] = values.reshape(row["input_shape"])
                if row.get("input_name") or row.get("input_class"):
                    names[key] = (row["input_name"] or "", row["input_class"] or "")
    return inputs, names


#: ``top_units``' columns: the unit, its rank in its layer by largest response, its statistics, and one
#: of its top samples with the name its user knows it by.
TOP_UNIT_COLUMNS = ["hook", "layer", "call", "unit", "unit_rank", "max", "mean", "dead_fraction", "layer_units",
                    "layer_dead_units", "rank", "sample", "value", "input", "class"]
#: Tokens shown either side of a text sample's top position in its ``input``.
CONTEXT = 4


def top_units(path: str | Path, layer: str | None = None, k: int = 3, examples: int = 4,
              on_corrupt: str = "error") -> pd.DataFrame:
    """The ``k`` units of each layer (or of ``layer``) that respond most strongly (largest ``max`` over
    the dataset, a sample's value being its maximum over positions) of the run at ``path`` (a sweep's jobs
    merged, as ``load_units``), each with its first ``examples`` top samples: one row per unit and sample
    (``rank`` 0 its largest, ``value``), ``input`` naming the sample as its user knows it (an ``imagefolder``
    file's path under the folder, with its ``class`` folder; a text sample's tokens around the top position,
    the top one bracketed, as ids (no tokenizer is kept); ``sample N`` otherwise, N its dataset index in
    every pass; ``unnamed`` where the data cannot say which item it was, ``named`` false), the
    unit's ``dead_fraction`` (of its values at or below the entry's threshold), and its layer's units and
    dead units (never above the threshold); layers in the model's order. Read from the run's files alone
    (``TOP_UNIT_COLUMNS``).

    Example:
        >>> top_units("outputs/units", "layer3")[["unit", "max", "input", "class"]]
    """
    units = load_units(path, on_corrupt)
    if layer is not None:
        if layer not in set(units.layer):
            raise KeyError(f"no layer '{layer}' in the units of '{path}'; "
                           f"layers: {', '.join(dict.fromkeys(units.layer))}")
        units = units[units.layer == layer]
    inputs, names = kept_inputs(path, on_corrupt, images=False)  # a text sample's ids name it; images do not
    first = next(run for run in run_dirs(path, on_corrupt) if rank_files(run, UNITS))
    order = {name: i for i, name in enumerate(recorded_layers(first))}  # the model's order, not the names'
    groups = sorted(units.groupby(["hook", "layer", "call"], sort=False),
                    key=lambda kv: order.get(kv[0][1], len(order)))
    rows = []
    for (hook, name, call), group in groups:
        dead_units = int((group.above == 0).sum())
        best = group.sort_values(["max", "unit"], ascending=[False, True]).head(k)
        for unit_rank, row in enumerate(best.itertuples()):
            for rank in range(min(examples, len(row.top_sample))):
                sample, position = int(row.top_sample[rank]), int(row.top_position[rank])
                named, label = names.get((hook, sample), ("", ""))
                said = named or (_text_or_index(inputs.get((hook, sample)), sample, position)
                                 if row.named is None or row.named else UNNAMED)
                rows.append([hook, name, call, row.unit, unit_rank, row.max, row.mean, 1 - row.fraction_above,
                             len(group), dead_units, rank, sample, float(row.top_value[rank]), said, label or None])
    return pd.DataFrame(rows, columns=TOP_UNIT_COLUMNS)


def classes_said(labels: list[str | None]) -> str:
    """What the classes of some top examples are: ``all in class top`` when every one has that class,
    ``classes top 3, bottom 1`` when several; ``""`` when the data name no class."""
    named = pd.Series([label for label in labels if label], dtype=object)
    if named.empty:
        return ""
    counts = named.value_counts()
    if len(counts) == 1 and len(named) == len(labels):
        return f"all in class {counts.index[0]}"
    return "classes " + ", ".join(f"{name} {count}" for name, count in counts.items())


#: What ``top_units`` calls a sample of data that cannot name it (``named`` false: its id only counts the run's samples).
UNNAMED = "unnamed"


def with_named(table: pa.Table) -> pa.Table:
    """``table`` with its ``named`` column; a file written before it had one gets nulls: not known."""
    if "named" in table.column_names:
        return table
    return table.append_column("named", pa.nulls(len(table), pa.bool_()))


def _text_or_index(kept: np.ndarray | None, sample: int, position: int) -> str:
    """A sample without a name: its token ids around ``position`` (the top one bracketed) when the run kept
    them, else its sample id (its dataset index)."""
    if kept is None or kept.dtype.kind not in "iu" or kept.ndim != 1 or not 0 <= position < len(kept):
        return f"sample {sample}"
    first, last = max(0, position - CONTEXT), min(len(kept), position + CONTEXT + 1)
    words = [f"[{kept[i]}]" if i == position else str(kept[i]) for i in range(first, last)]
    return f"sample {sample}: {'... ' if first else ''}{' '.join(words)}{' ...' if last < len(kept) else ''}"


def recorded_layers(run_dir: str | Path) -> list[str]:
    """The layers of the run's ``units.parquet`` in the order it recorded them: the model's call order."""
    return list(dict.fromkeys(pq.read_table(rank_files(Path(run_dir), UNITS)[0][1], columns=["layer"])
                              .column("layer").to_pylist()))


def _read(file: Path) -> pa.Table:
    """One ``units.parquet``; one whose sketches use another bucket mapping (written by an earlier
    version) is refused: its quantiles would be read with the wrong buckets."""
    table = with_named(pq.read_table(file))
    mappings = set(table.column("sketch_mapping").to_pylist()) if "sketch_mapping" in table.column_names else {None}
    if table.num_rows and mappings != {SketchGrid.MAPPING}:  # no rows: no sketch to misread
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
    out["named"] = False if any(named is not None and not named for named in rows.get("named", ())) \
        else first.get("named")
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
