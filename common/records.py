"""The record schema and the run directory's file names, in one place: what a row of
``stats.parquet`` / ``tensors.parquet`` / ``steps.parquet`` is, and what each file is called.

The recorder fills these columns, the writer (``runner.store.outputs``) turns them into Arrow
with these types, the commit protocol and the readers (``runner.analysis.load``,
``common.rundir``) find the files by these names. A new column, kind, phase or file is added
here. Imports nothing of ``hooks`` or ``runner``.
"""
from __future__ import annotations

import pyarrow as pa

#: The files of a run directory: three tables, the resolved config, and the manifest written last.
STATS, TENSORS, STEPS = "stats.parquet", "tensors.parquet", "steps.parquet"
TABLES = (STATS, TENSORS, STEPS)
#: The table of run totals a ``units`` entry writes once, at the end of the run.
UNITS = "units.parquet"
CONFIG, MANIFEST = "config.yaml", "manifest.json"
#: The run directory's TensorBoard event files: the export's and ``logger=tensorboard``'s.
EVENTS_DIR = "tensorboard"
#: Manifest key: the classes ``loss=class_score`` without ``target_class`` chose for step 0's samples.
EXPLAINED_CLASSES = "explained_classes"

#: Columns that identify one captured tensor, with their Arrow types, in output order. ``step``
#: is added by the writer; the recorder fills the others.
ID_FIELDS = (
    pa.field("step", pa.int64()),
    pa.field("call", pa.int64()),
    pa.field("hook", pa.string()),
    pa.field("layer", pa.string()),
    pa.field("phase", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("slot", pa.string()),
    pa.field("tensor_shape", pa.list_(pa.int64())),  # not "shape": pandas' DataFrame.shape would shadow it
    pa.field("dtype", pa.string()),
    pa.field("numel", pa.int64()),
)
#: The identifier columns the recorder fills (every ``ID_FIELDS`` name but ``step``).
ID_COLUMNS = tuple(f.name for f in ID_FIELDS if f.name != "step")

#: Statistic columns with their Arrow types (see ``hooks.stats.summarize`` for their meaning).
STAT_FIELDS = (
    pa.field("mean", pa.float64()),
    pa.field("std", pa.float64()),
    pa.field("min", pa.float64()),
    pa.field("max", pa.float64()),
    pa.field("abs_mean", pa.float64()),
    pa.field("l2", pa.float64()),
    pa.field("zero_frac", pa.float64()),
    pa.field("nan_count", pa.int64()),
    pa.field("inf_count", pa.int64()),
)
STAT_COLUMNS = tuple(f.name for f in STAT_FIELDS)
#: A kept tensor's values, flattened row-major as float32 (``tensor_shape`` restores it).
TENSOR_VALUES = pa.field("tensor_values", pa.large_list(pa.float32()))
#: "2": the tensor columns are ``tensor_shape`` and ``tensor_values`` (were ``shape`` and ``values``,
#: which pandas shadows with ``DataFrame.shape`` and ``DataFrame.values``).
SCHEMA_VERSION = "2"

STATS_SCHEMA = pa.schema(list(ID_FIELDS) + list(STAT_FIELDS))
TENSORS_SCHEMA = pa.schema(list(ID_FIELDS) + [TENSOR_VALUES])
#: A row of ``steps.parquet`` (one per step and split); ``STEP_METRICS`` follow as float64 columns.
STEP_FIELDS = (
    pa.field("step", pa.int64()),
    pa.field("split", pa.string()),
    pa.field("loss", pa.float64()),
    pa.field("wall_time_s", pa.float64()),
    pa.field("captures", pa.int64()),
    pa.field("peak_memory_bytes", pa.int64()),
)
#: Optional per-step measures (``RunOutputs.write_step(metrics=...)``): NaN where a step has none.
STEP_METRICS: tuple[str, ...] = ("accuracy",)  #: of the batch (train) or the held-out set (eval)
STEP_METRICS += ("logit", "logit_diff")  #: ``metric.target`` / ``metric.diff`` (``runner.engine.metrics``)
#: the same of the clean and of the unpatched corrupted pass beside each step (``patch`` with ``source: clean``)
STEP_METRICS += tuple(f"{side}_{name}" for side in ("clean", "corrupted") for name in ("logit", "logit_diff"))
STEPS_SCHEMA = pa.schema(list(STEP_FIELDS) + [pa.field(name, pa.float64()) for name in STEP_METRICS])
#: Each file's schema, by name.
TABLE_SCHEMAS = {STATS: STATS_SCHEMA, TENSORS: TENSORS_SCHEMA, STEPS: STEPS_SCHEMA}


#: ``units.parquet``: one row per (entry, layer, call, unit) of a ``units`` entry's run totals, in
#: columns that merge exactly across jobs (counts, Chan's ``(count, mean, M2)``, min, max, sketch
#: bucket counts, top-k candidates, sums of outer products: ``runner.analysis.load_units``).
_F64, _I64 = pa.float64(), pa.int64()
UNITS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("layer", pa.string()), pa.field("call", _I64), pa.field("unit", _I64),
    pa.field("count", _I64), pa.field("mean", _F64), pa.field("m2", _F64), pa.field("min", _F64),
    pa.field("max", _F64), pa.field("threshold", _F64), pa.field("above", _I64), pa.field("top_k", _I64),
    pa.field("relative_error", _F64), pa.field("sketch_low", _F64), pa.field("sketch_high", _F64),
    pa.field("sketch_index", pa.list_(pa.int32())), pa.field("sketch_count", pa.list_(_I64)),
    pa.field("top_value", pa.list_(_F64)), pa.field("top_sample", pa.list_(_I64)),
    pa.field("top_position", pa.list_(_I64)), pa.field("bottom_value", pa.list_(_F64)),
    pa.field("bottom_sample", pa.list_(_I64)), pa.field("bottom_position", pa.list_(_I64)),
    pa.field("position_shape", pa.list_(_I64)), pa.field("second_moment", pa.list_(_F64)),
])
UNIT_COLUMNS = tuple(UNITS_SCHEMA.names)

#: What a row holds. Activations and module gradients come per call; ``param_grad`` per
#: parameter; ``saved`` is what autograd saved (as packed); ``patched`` is the stored value a
#: ``patch`` entry put in (the part its ``index`` selects); ``clipped`` is what a ``clamp`` entry
#: removed from a gradient (``grad - clamped``: ``1 - zero_frac`` is the fraction of elements clipped). A complex tensor gets two rows per
#: capture, one per part, with slots ``SLOT.real`` and ``SLOT.imag`` (its dtype column stays
#: complex; the statistics are those of the part, never of ``|z|``).
KINDS = ("input", "output", "grad_input", "grad_output", "param_grad", "saved", "patched", "clipped")
#: Kinds whose first dimension is the batch and second the channels (``sample.batch`` and
#: ``sample.channels`` narrow them; parameter gradients have neither).
BATCH_KINDS = frozenset({"input", "output", "grad_input", "grad_output"})
#: When a row was recorded: during forward, during backward, after backward (accumulated
#: ``.grad``), in an evaluation pass, or while activation checkpointing recomputed a forward
#: inside backward (``recompute``: the same call again, not a new one).
PHASES = ("forward", "backward", "after_backward", "eval", "recompute")
