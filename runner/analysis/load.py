"""Load runs and sweeps into tidy pandas DataFrames.

A run directory is one that holds ``manifest.json`` (written last, so only complete runs are
read); a sweep directory is searched for run directories at any depth. Every row carries the
``run_dir`` it came from and one column per Hydra override of its job (``model``, ``hooks``,
``hooks.clip.max``; an override named like a record column is ``override.NAME``: ``loss=sum`` is
``override.loss`` beside the steps' ``loss``), so a sweep is one table to group by: numbers as numbers, text (``layer``,
``kind``, ``hook``, ..., the overrides' text and ``run_dir``) as pandas categoricals, which do
not repeat a string per row (``run_dir`` and the overrides' categories in job order: the order of
the values on the command line, ``runner.analysis.order``), and ``tensor_shape`` as a categorical of
tuples (``runner.analysis.frame``). All files of a sweep are read as one pyarrow dataset; where
files differ in columns the schema unifies them, so a column that only some jobs wrote is kept
(null in the rows of the others), and ``columns``/``filters`` are pushed down into the scan.
Values are converted from Arrow to numpy directly, so a NaN stays a NaN.

Jobs of a sweep still writing are not read, and a damaged run (a truncated file, a corrupt
manifest) is one error naming the file, or left out with ``on_corrupt="skip"``
(``runner.analysis.intact``).

Every row has a ``rank``: the process that recorded it in a run under ``torch.distributed`` (each
rank writes its own part, ``runner.store.ranks``), 0 otherwise; ``part_rank`` in the frame of a file
with a ``rank`` of its own (``unit_examples.parquet``: an example's place among its unit's top samples),
which is kept as the file holds it (``process_rank_column``).

Files written before ``schema_version`` "2" named the tensor columns ``values`` and ``shape``;
they are read under today's names, ``tensor_values`` and ``tensor_shape``.

Example:
    >>> df = load_stats("outputs/multirun/2026-11-22/10-00-00")
    >>> df[df.kind == "param_grad"].groupby(["hooks.clip.max", "layer"], observed=True).l2.max()
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.job_status import StatusError, job_dirs_with_status, read_job_status
from common.records import ID_FIELDS, MANIFEST, RUN_TOTAL_SCHEMAS, STATS, STEPS, TABLE_SCHEMAS, TENSORS
from common.tags import label_of
from runner.analysis.frame import to_frame
from runner.analysis.intact import Run, find_jobs, intact, read_manifest, warn_pending
from runner.analysis.order import natural_sorted
from common.run_config import saved_config_path
from runner.analysis.sweep_jobs import incomplete, listed_failures, listed_runs, listed_states

#: Where a failed job of a sweep says why (``{"status": "failed", "error": ...}``); it has no manifest.
#: Stored column names before ``schema_version`` "2" -> the names the loaders return.
RENAMED = {"values": "tensor_values", "shape": "tensor_shape"}
#: Columns of a capture row and of a step row, for the empty frame of runs that wrote no such file.
_CAPTURE_COLUMNS = tuple(f.name for f in ID_FIELDS)
_STEP_COLUMNS = ("step", "split", "loss", "wall_time_s", "captures")
# numpy has no bfloat16: such tensors come back as float32.
_NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int64": np.int64,
                 "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def run_dirs(path: str | Path, on_corrupt: str = "error") -> list[Path]:
    """Every complete run directory at or under ``path``, in job order (``2`` before ``10``); an error if none
    (saying so where ``path`` does not exist).

    Hidden directories (Hydra's ``.hydra``, submitit's ``.submitit``) hold no runs and are not searched.
    Jobs still writing are not read (one ``PendingRunsWarning`` says how many); a damaged run raises
    ``CorruptRunError`` naming its file, or is left out with ``on_corrupt="skip"`` (``runner.analysis.intact``).
    """
    return [Path(run) for run in _committed(Path(path), on_corrupt)[0]]


def _committed(path: Path, on_corrupt: str, table: str | None = None) -> tuple[dict[str, Run], dict[str, pa.Schema]]:
    """``run_dirs``' runs with what the loaders need of each to read ``table``, in job order, and
    the footers read to check them (``intact``)."""
    if not path.exists():
        raise FileNotFoundError(f"'{path}' does not exist: no complete run there")
    if (path / MANIFEST).is_file():
        found, pending = [path], []
    else:
        found, pending = listed_runs(path), []  # a sweep's own record of its runs (sweep.json), in job order
        if found is None:
            found, pending = find_jobs(path)
            found = natural_sorted(found)  # numbered job directories: 2 before 10
    warn_pending(path, pending, len(found))
    if not found:
        state = incomplete(path)
        raise FileNotFoundError(f"no complete run (a directory with {MANIFEST}) at or under '{path}'"
                                + (f": {state}" if state else ""))
    runs, footers = intact(found, on_corrupt, table)
    if not runs:
        raise FileNotFoundError(f"no undamaged complete run at or under '{path}'")
    return runs, footers


def failed_jobs(path: str | Path) -> pd.DataFrame:
    """Jobs at or under ``path`` that wrote no data: ``job_dir``, ``overrides`` (one string) and ``error``.

    A sweep's ``sweep.json`` lists them all: failed, interrupted, ended by the scheduler, and not
    started (a stopped sweep's); ``error`` starts with the state when it is not ``failed``
    (``interrupted: ...``, ``not started: ...``). Without one, a failed job is found by its
    ``status.json`` (``"status": "failed"``, no manifest); its overrides are read from the status
    file or, failing that, from Hydra's ``.hydra/overrides.yaml``.
    """
    listed = listed_failures(path)  # a sweep's sweep.json, with jobs the scheduler ended
    if listed is not None:
        return pd.DataFrame(listed, columns=["job_dir", "overrides", "error"])
    rows = []
    for job in job_dirs_with_status(path):
        try:
            status = read_job_status(job) or {}
        except StatusError as exc:
            status = {"status": "failed", "error": str(exc)}
        if status.get("status") != "failed" or (job / MANIFEST).is_file():
            continue
        overrides = status.get("overrides")
        if overrides is None and (job / ".hydra" / "overrides.yaml").is_file():
            overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        rows.append({"job_dir": str(job), "overrides": " ".join(overrides or []),
                     "error": str(status.get("error") or status.get("message") or "(no error recorded)")})
    return pd.DataFrame(rows, columns=["job_dir", "overrides", "error"])


def sweep_state(path: str | Path) -> pd.DataFrame:
    """One row per job of the sweep at ``path``, in job order: ``num``, ``overrides`` (its swept
    values, one string), ``state`` (``ok``, ``failed``, ``interrupted``, ``pending``: not started,
    ``running``, or the scheduler's ``cancelled``, ``timeout``, ``requeued``), ``error``, ``run_dir``.

    Read from ``sweep.json``, reconciled with the job directories (a job whose process was killed
    is ``interrupted``); ``FileNotFoundError`` where the sweep wrote none.
    """
    jobs = listed_states(path)
    if jobs is None:
        raise FileNotFoundError(f"no sweep.json at '{path}': not a sweep's directory, or a sweep from before it")
    return pd.DataFrame(jobs, columns=["num", "overrides", "state", "error", "run_dir"])


def config_of(run_dir: Path) -> str | None:
    """The job's config as YAML, resolved where it can be; ``None`` when the run was not made by the CLI.

    Hydra saves the composed config (interpolations unresolved) in ``.hydra/config.yaml``.
    """
    path = saved_config_path(run_dir)
    if path is None:
        return None
    cfg = OmegaConf.load(path)
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException:  # e.g. ${hydra:...}, which only resolves inside a Hydra job
        return OmegaConf.to_yaml(cfg)


def overrides_of(run_dir: Path) -> dict[str, Any]:
    """The job's Hydra overrides as ``{key: value}``, values parsed as YAML scalars where they are."""
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise FileNotFoundError(f"no complete run (a directory with {MANIFEST}) at '{run_dir}'")
    return _overrides(manifest.get("overrides", []))


def _overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        out[key.lstrip("+~")] = _value(raw)
    return out


@functools.lru_cache(maxsize=4096)
def _value(raw: str) -> Any:
    """An override's value: a number as Hydra reads it (``1e-3`` too), another YAML scalar, or the raw text.

    Cached, and numbers parsed without YAML, because a sweep of thousands of jobs repeats them.
    """
    for number in (int, float):
        try:
            return number(raw)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(raw) if raw else raw
    except yaml.YAMLError:
        return raw
    return value if np.isscalar(value) or value is None else raw


def process_rank_column(name: str) -> str:
    """The column the loaders add to file ``name``'s rows for the process that recorded each: ``rank``, or
    ``part_rank`` where the file has a ``rank`` column of its own, which it must not replace."""
    return "part_rank" if "rank" in {**TABLE_SCHEMAS, **RUN_TOTAL_SCHEMAS}[name].names else "rank"


#: The columns of the files the loaders read, and those they add: an override of one of these names
#: (``loss=sum``) is the column ``override.NAME`` (``override.loss``), in every loader's frame.
RECORD_COLUMNS = frozenset({name for schema in (*TABLE_SCHEMAS.values(), *RUN_TOTAL_SCHEMAS.values())
                            for name in schema.names} | {*RENAMED, "rank", "part_rank", "run_dir", "tensor"})


def override_column(key: str) -> str:
    """The column of override ``key``: ``key``, or ``override.KEY`` where a record column has its name
    (``loss=sum`` beside the steps' ``loss``): the swept value and the recorded one both stay."""
    return f"override.{key}" if key in RECORD_COLUMNS else key


def override_columns(df: pd.DataFrame) -> list[str]:
    """The override columns the loaders attached to ``df`` (recorded in ``df.attrs["overrides"]``)."""
    return [c for c in df.attrs.get("overrides", ()) if c in df.columns]


def _dataset(files: list[str], fingerprints: list[str | None], footers: dict[str, pa.Schema]) -> ds.Dataset:
    """One dataset over ``files``, its text columns read as dictionaries (each file's strings
    decoded once per distinct value, the form a categorical keeps).

    Files written by other versions may differ in columns: the schema unifies the files' schemas,
    so a column only some files have is kept (null in the others' rows). A file's schema is read
    from its footer once per distinct ``fingerprints`` entry (``intact.Part.schema``; ``None``: the
    file's own footer), not once per file: reading 1,000 footers took about 0.2 s, as long as a
    projected read of the whole sweep. No footer is kept; ``footers`` are those already read.
    """
    first = {}
    for file, fingerprint in zip(files, fingerprints):
        first.setdefault(fingerprint or file, file)
    schemas = [(footers.get(file) or pq.read_schema(file)).remove_metadata() for file in first.values()]
    schema = schemas[0] if len(schemas) == 1 else pa.unify_schemas(schemas, promote_options="permissive")
    text = [f.name for f in schema if pa.types.is_string(f.type)]
    schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type)) if f.name in text else f for f in schema])
    # No pre-buffering, which pays off on object stores: local files of a few kB each scan about 15% faster.
    scan = ds.ParquetFragmentScanOptions(pre_buffer=False)
    text_format = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=text),
                                       default_fragment_scan_options=scan)
    return ds.dataset(files, schema=schema, format=text_format)


def _stored_as_today(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the columns of ``RENAMED`` under today's names, last (one column where a sweep has both)."""
    for old, new in RENAMED.items():
        if old in schema.names:
            kind = schema.field(old).type
            schema = pa.schema([f for f in schema if f.name not in (old, new)]).append(pa.field(new, kind))
    return schema


def _as_today(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema`` (``_stored_as_today``): an old column under its new name, or filling its gaps."""
    found = dict(zip(batch.schema.names, batch.columns))
    for old, new in RENAMED.items():
        if old in found:
            value = found.pop(old)
            found[new] = pc.coalesce(found[new], value) if new in found else value
    return pa.RecordBatch.from_arrays([found[name] for name in schema.names], schema=schema)


def _scan(dataset: ds.Dataset, columns: list[str], expression: Any, position: dict[str, int], rows: int
          ) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows of ``columns`` that pass ``expression`` as a frame (``frame.to_frame``, ``rows`` a
    guess of their number), and for each row the index of its file in ``position``."""
    # Two files read ahead, not pyarrow's four: what waits in the queue is memory held beside
    # the frame (a 1,000-job sweep's peak: 1.6 against 1.4 times the frame).
    scanner = dataset.scanner(columns=columns, filter=expression, cache_metadata=False, fragment_readahead=2)
    schema = _stored_as_today(scanner.projected_schema)
    renamed = schema != scanner.projected_schema
    batches = ((_as_today(t.record_batch, schema) if renamed else t.record_batch, position[t.fragment.path])
               for t in scanner.scan_batches())
    return to_frame(batches, schema, rows)


def _per_row(codes: np.ndarray, values: list) -> np.ndarray | pd.Categorical:
    """Per-row column from per-run ``values`` and each row's run index ``codes``.

    Numbers (with ``None`` as NaN) stay numeric, so they compare and compute as numbers; anything
    else is a categorical, one string per run rather than per row.
    """
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) or v is None for v in values) \
            and any(v is not None for v in values):
        as_float = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        exact = all(isinstance(v, (int, np.integer)) for v in values)
        return (as_float.astype(np.int64) if exact else as_float)[codes]
    return _categorical(codes, values)


def _categorical(codes: np.ndarray, values: list) -> pd.Categorical:
    """Per-row categorical from per-run ``values`` and each row's run index ``codes`` (None -> missing)."""
    # In the order the runs first have them: the runs are in job order, so groupby and legends list the
    # values as the command line wrote them (sorting would put {min:-0.01} before {min:-1000}).
    categories = list(dict.fromkeys(v for v in values if v is not None))
    index = {v: i for i, v in enumerate(categories)}
    per_run = np.array([index[v] if v is not None else -1 for v in values], dtype=np.int32)
    try:
        return pd.Categorical.from_codes(per_run[codes], categories=categories)
    except (TypeError, ValueError):  # mixed types (1 and "a") that pandas cannot keep as one index
        return pd.Categorical.from_codes(per_run[codes], categories=[str(c) for c in categories])


def _override_values(runs: Sequence[Run]) -> dict[str, list]:
    """Each override key of ``runs`` with its value in each run (``None`` where a run has none):
    one list per key, not one dict per run."""
    values: dict[str, list] = {}
    for i, run in enumerate(runs):
        for key, value in _overrides(run.overrides).items():
            values.setdefault(key, [None] * len(runs))[i] = value
    return values


def _load(path: str | Path, name: str, columns: Sequence[str] | None, filters: Any, on_corrupt: str,
          empty_columns: Sequence[str] = _CAPTURE_COLUMNS) -> pd.DataFrame:
    committed, footers = _committed(Path(path), on_corrupt, name)
    committed = {run: kept for run, kept in committed.items() if kept.parts}  # e.g. no tensors.parquet
    if not committed:
        empty = pd.DataFrame(columns=list(columns) if columns else list(empty_columns))
        return empty.assign(**{process_rank_column(name): pd.Series([], dtype=np.int64)}, run_dir=pd.Categorical([]))
    # Of each file (one per rank of a run), what the scan needs, as columns: what a sweep keeps
    # beside its rows is a few small objects per job, not a record (``intact.Run``) per job.
    parts = [(i, part) for i, kept in enumerate(committed.values()) for part in kept.parts]
    run_of = np.array([i for i, _ in parts], dtype=np.int32)
    ranks = np.array([part.rank for _, part in parts], dtype=np.int64)  # 0 unless under torchrun
    files = [part.file for _, part in parts]
    fingerprints = [part.schema for _, part in parts]
    rows = sum(part.rows for _, part in parts)
    runs, overridden = list(committed), _override_values(list(committed.values()))
    del parts, committed
    dataset = _dataset(files, fingerprints, footers)
    del fingerprints, footers
    stored = dataset.schema.names
    wanted = None if columns is None else [c for c in stored if c in columns or RENAMED.get(c) in columns]
    expression = pq.filters_to_expression(filters) if isinstance(filters, (list, tuple)) else filters
    df, codes = _scan(dataset, wanted if wanted is not None else stored, expression,
                      {file: i for i, file in enumerate(files)}, rows)
    del dataset, files
    run_codes = run_of[codes]
    for key, values in overridden.items():
        df[override_column(key)] = _per_row(run_codes, values)
    df[process_rank_column(name)] = ranks[codes]
    df["run_dir"] = pd.Categorical.from_codes(run_codes, categories=runs)  # runs are in job order, distinct
    df.attrs["overrides"] = [override_column(key) for key in overridden]
    return df


def load_stats(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None,
               on_corrupt: str = "error") -> pd.DataFrame:
    """One row per captured tensor per call, from one run or every run of a sweep.

    Args:
        path: a run directory or any directory above run directories (a sweep).
        columns: read only these parquet columns (override, ``rank`` and ``run_dir`` columns are always added).
        filters: pyarrow filters applied while reading, e.g. ``[("kind", "=", "param_grad")]``
            (a list of tuples or a ``pyarrow.compute`` expression).
        on_corrupt: ``"error"``: a damaged run (a truncated parquet file, a corrupt manifest) raises
            ``CorruptRunError`` naming the file; ``"skip"``: the other runs are read, with one warning
            listing what was left out. Jobs still writing are never read (one warning says how many).
    """
    return _load(path, STATS, columns, filters, on_corrupt)


def load_steps(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None,
               on_corrupt: str = "error") -> pd.DataFrame:
    """One row per step and split per run: ``split``, ``loss``, ``wall_time_s``, the number of captures.

    Training runs interleave evaluation rows (``split == "eval"``) with the training steps
    (``split == "train"``) at the same step numbers, so pivot one split at a time.

    Example (a sweep's loss curves, one column per job):
        >>> steps = load_steps(sweep)
        >>> train = steps[steps.split == "train"].pivot(index="step", columns="run_dir", values="loss")
        >>> evals = steps[steps.split == "eval"].pivot(index="step", columns="run_dir", values="loss")

    ``on_corrupt`` as for ``load_stats``.
    """
    return _load(path, STEPS, columns, filters, on_corrupt, _STEP_COLUMNS)


def load_tensors(path: str | Path, columns: Sequence[str] | None = None, filters: Any = None,
                 on_corrupt: str = "error") -> pd.DataFrame:
    """Captured tensors with a ``tensor`` column of numpy arrays in their original shape and dtype.

    ``tensor_values`` (the flat float32 list stored in parquet) is replaced by ``tensor``. A run
    that kept no tensor (no ``tensors.parquet``) gives an empty frame with the capture columns.
    ``on_corrupt`` as for ``load_stats``.
    """
    wanted = None if columns is None else sorted({*columns, "tensor_values", "tensor_shape", "dtype"})
    df = _load(path, TENSORS, wanted, filters, on_corrupt)
    if "tensor_values" not in df.columns:
        return df.assign(tensor=pd.Series([], dtype=object))
    df["tensor"] = pd.Series([
        np.asarray(values, dtype=np.float32).reshape(shape).astype(_NUMPY_DTYPES.get(dtype, np.float32))
        for values, shape, dtype in zip(df["tensor_values"], df["tensor_shape"], df["dtype"])
    ], index=df.index, dtype=object)
    return df.drop(columns="tensor_values")


#: Kinds that hold gradients (the rest hold activations).
GRADIENT_KINDS = ("grad_output", "grad_input", "param_grad")


def across_families(rows: pd.DataFrame) -> bool:
    """Whether ``rows`` hold runs of several transformer families: one canonical name (``blocks.3.resid_post``)
    stands for modules of different names (``transformer.h.3``, ``model.layers.3``)."""
    if "canonical" not in rows.columns:
        return False
    named = rows.dropna(subset=["canonical"])
    return bool((named.groupby("canonical")["layer"].nunique() > 1).any())


def per_layer(stats: pd.DataFrame, kind: str, step: int | None = None) -> pd.DataFrame:
    """Rows of one ``kind`` at one step (default the first), in depth order, with ``label`` and ``abs_max``.

    Training rows only, where the run has any: the eval passes (phase ``eval``) are left out.

    Depth order is forward call order; gradients arrive in backward from the last layer to the
    first, so rows recorded in phase ``backward`` are reversed. ``param_grad`` is read from the
    accumulated ``.grad`` (phase ``after_backward``) when the run recorded it. When several hooks
    record the same layer, the first one's row is kept. ``label`` names the
    layer, with the parameter (``fc.bias``), a non-default slot (``split[1]``) or a repeated call
    (``layer1.0.relu #1``), so each label is one line in a plot; rows of several transformer families
    (``across_families``) are labelled by their canonical name, which the families share.
    """
    rows = stats[stats["kind"] == kind]
    if (rows["phase"] != "eval").any():
        rows = rows[rows["phase"] != "eval"]
    if rows.empty:
        return rows.assign(label=pd.Series(dtype=str), abs_max=pd.Series(dtype=float))
    step = int(rows["step"].min()) if step is None else step
    rows = rows[rows["step"] == step]
    if kind == "param_grad" and (rows["phase"] == "after_backward").any():
        rows = rows[rows["phase"] == "after_backward"]
    rows = rows.drop_duplicates(["run_dir", "layer", "slot", "call"])  # several hooks on one layer: the first
    if (rows["phase"] == "backward").all():
        rows = rows.iloc[::-1]
    labels = [label_of(layer, kind, slot, call)
              for layer, slot, call in zip(rows["layer"], rows["slot"], rows["call"])]
    if across_families(rows):  # one x per canonical name: each family's line over the same blocks
        labels = [label if pd.isna(canonical) else canonical for label, canonical in zip(labels, rows["canonical"])]
    return rows.assign(label=labels, abs_max=np.maximum(rows["max"].abs(), rows["min"].abs())
                       ).reset_index(drop=True)



def abnormal(stats: pd.DataFrame) -> pd.DataFrame:
    """Captures that look broken, one row per (run, hook, layer, kind, slot) and problem.

    Problems: ``non-finite`` (NaN or Inf elements), ``zero gradient`` (every captured gradient
    exactly 0: nothing flows back through the layer), ``all zero`` (an activation that is 0
    everywhere, e.g. a ReLU whose every unit is dead).
    """
    keys = ["run_dir", "hook", "layer", "kind", "slot"]
    stats = stats[stats["kind"] != "clipped"]  # what a clamp removed: 0 where it clipped nothing, as it should be
    flags = stats[keys].assign(nan=stats["nan_count"], inf=stats["inf_count"],
                               bad=(stats["nan_count"] > 0) | (stats["inf_count"] > 0),
                               zero=stats["l2"] == 0, empty=stats["zero_frac"] == 1, n=1)
    groups = flags.groupby(keys, sort=False, observed=True)[["nan", "inf", "bad", "zero", "empty", "n"]].sum()
    found = []
    for key, nan, inf, bad, zero, empty, n in groups.itertuples(name=None):
        if nan or inf:
            found.append((*key, "non-finite", f"{nan} NaN and {inf} Inf elements in {bad} of {n} capture(s)"))
        elif key[3] in GRADIENT_KINDS and zero == n:
            found.append((*key, "zero gradient", f"exactly 0 in each of {n} capture(s)"))
        elif key[3] not in GRADIENT_KINDS and empty == n:
            found.append((*key, "all zero", f"0 everywhere in each of {n} capture(s)"))
    return pd.DataFrame(found, columns=[*keys, "problem", "detail"])


def dead_units(tensors: pd.DataFrame) -> pd.DataFrame:
    """Units (dim 1: channels or features) of non-negative captured outputs that are 0 for every sample.

    Only outputs whose every kept value is >= 0 are examined (what a ReLU produces); a unit is
    dead when it is 0 at every sample, position and step kept. ``tensors`` is ``load_tensors``'s
    frame. One row per (run, hook, layer, slot): ``units``, ``dead``, ``dead_frac``.
    """
    keys = ["run_dir", "hook", "layer", "slot"]
    rows = tensors[tensors["kind"] == "output"]
    found = []
    for key, group in rows.groupby(keys, sort=False, observed=True):
        arrays = [t for t in group["tensor"] if t.ndim >= 2]
        if not arrays or any(t.min() < 0 for t in arrays) or len({t.shape[1] for t in arrays}) > 1:
            continue
        alive = np.zeros(arrays[0].shape[1], dtype=bool)
        for t in arrays:
            alive |= (np.moveaxis(t, 1, 0).reshape(t.shape[1], -1) != 0).any(axis=1)
        found.append((*key, alive.size, int((~alive).sum()), float((~alive).mean())))
    return pd.DataFrame(found, columns=[*keys, "units", "dead", "dead_frac"])


def load_table(path: str | Path, name: str, columns: Sequence[str] | None = None, filters: Any = None,
               on_corrupt: str = "error") -> pd.DataFrame:
    """The rows of the run-total file ``name`` (``common.records.RUN_TOTAL_SCHEMAS``: ``steer.parquet``,
    ``lens.parquet``) of one run or of every run of a sweep, with each job's overrides as columns;
    ``on_corrupt`` as for ``load_stats``."""
    if name not in RUN_TOTAL_SCHEMAS:
        raise ValueError(f"'{name}' is not a run-total file; valid: {', '.join(RUN_TOTAL_SCHEMAS)}")
    return _load(path, name, columns, filters, on_corrupt, RUN_TOTAL_SCHEMAS[name].names)
