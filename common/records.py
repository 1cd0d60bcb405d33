"""The record schema and the run directory's file names, in one place: what a row of
``stats.parquet`` / ``tensors.parquet`` / ``steps.parquet`` is, and what each file is called.

The recorder fills these columns, the writer (``runner.store.outputs``) turns them into Arrow
with these types, the commit protocol and the readers (``runner.analysis.load``,
``common.rundir``) find the files by these names. A new column, kind, phase or file is added
here. Imports nothing of ``hooks`` or ``runner``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # the floor imports no torch: a step's kept tensors are only named here
    import numpy as np
    import torch

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
#: The columns every steps row has, which no measure may take.
STEP_COLUMNS = tuple(field.name for field in STEP_FIELDS)


def steps_schema(measures: Sequence[str] = STEP_METRICS) -> pa.Schema:
    """``steps.parquet``'s schema for a run whose steps give ``measures`` (the built-in ones, then a
    run's registered measures: ``runner.engine.metrics.step_measures``)."""
    return pa.schema(list(STEP_FIELDS) + [pa.field(name, pa.float64()) for name in measures])


STEPS_SCHEMA = steps_schema()
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
    pa.field("sketch_mapping", pa.string()),
    pa.field("sketch_index", pa.list_(pa.int32())), pa.field("sketch_count", pa.list_(_I64)),
    pa.field("top_value", pa.list_(_F64)), pa.field("top_sample", pa.list_(_I64)),
    pa.field("top_position", pa.list_(_I64)), pa.field("bottom_value", pa.list_(_F64)),
    pa.field("bottom_sample", pa.list_(_I64)), pa.field("bottom_position", pa.list_(_I64)),
    pa.field("position_shape", pa.list_(_I64)), pa.field("second_moment", pa.list_(_F64)),
])
UNIT_COLUMNS = tuple(UNITS_SCHEMA.names)

#: ``unit_examples.parquet``: one row per (entry, layer, call, unit, rank) for the first ``examples`` top
#: samples of each unit (rank 0 the largest, in ``units.parquet``'s top order): the sample, its value and
#: position, and the unit's map at that sample from the run's own forward (``map_shape`` ``[h, w]``, the
#: positions max-pooled to at most 16 x 16 in float32, 1 KiB at most, so its peak is ``value``; empty for
#: a unit whose positions are not 2-D). What a picture of the top examples draws, never computed again.
UNIT_EXAMPLES = "unit_examples.parquet"
UNIT_EXAMPLES_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("layer", pa.string()), pa.field("call", _I64), pa.field("unit", _I64),
    pa.field("rank", _I64), pa.field("sample", _I64), pa.field("value", _F64), pa.field("position", _I64),
    pa.field("map_shape", pa.list_(_I64)), pa.field("map", pa.list_(pa.float32())),
])
#: ``unit_inputs.parquet``: one row per (entry, sample) of ``unit_examples.parquet``: the model's input for
#: that sample as the run fed it: an image (``[C, H, W]`` floats) area-pooled to at most 64 x 64 in
#: ``input`` (float32, 48 KiB at most for RGB), or token ids (1-D integers) as they were in ``input_ids``;
#: other inputs are not kept (both empty). ``input_name`` and ``input_class``: the sample as its user knows it,
#: from the data (``imagefolder``: the file's path under the folder and its class folder; ``""`` where the data
#: names none, the sample id being its name); a sample with neither an input nor a name kept has no row.
UNIT_INPUTS = "unit_inputs.parquet"
UNIT_INPUTS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("sample", _I64), pa.field("input_shape", pa.list_(_I64)),
    pa.field("input", pa.list_(pa.float32())), pa.field("input_ids", pa.list_(_I64)),
    pa.field("input_name", pa.string()), pa.field("input_class", pa.string()),
])

#: ``steer.parquet``: one row per (entry, step, sample) of a ``steer`` entry: the next-token
#: distribution at the last position with the steering vector added (``steered_*``) and without it
#: (``unsteered_*``, a pass of the same batch beside the step), ``kl`` = KL(unsteered || steered) in nats.
STEER = "steer.parquet"
STEER_SCHEMA = pa.schema([
    pa.field("method", pa.string()), pa.field("hook", pa.string()), pa.field("layers", pa.list_(pa.string())),
    pa.field("scale", _F64), pa.field("step", _I64), pa.field("sample", _I64), pa.field("kl", _F64),
    pa.field("steered_top_ids", pa.list_(_I64)), pa.field("steered_top_probs", pa.list_(_F64)),
    pa.field("unsteered_top_ids", pa.list_(_I64)), pa.field("unsteered_top_probs", pa.list_(_F64)),
])

#: ``lens.parquet``: one row per (entry, step, sample, block, position) of a ``logit_lens`` entry: the
#: block output read through the model's final norm and unembedding: the ``top_k`` token ids and logits,
#: and the target token's id, logit, probability and rank (0 = the top token; target -1 where there is none).
LENS = "lens.parquet"
LENS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("layer", pa.string()), pa.field("block", _I64), pa.field("step", _I64),
    pa.field("sample", _I64), pa.field("position", _I64), pa.field("top_ids", pa.list_(_I64)),
    pa.field("top_logits", pa.list_(_F64)), pa.field("target", _I64), pa.field("target_logit", _F64),
    pa.field("target_prob", _F64), pa.field("target_rank", _I64),
])

#: ``generations.parquet``: one row per (step, sample) of a ``mode=generate`` run (``runner.engine.generation``):
#: ``hook`` is ``GENERATE`` (the run's generation, not an entry), ``sample`` the prompt's dataset index,
#: ``prompt`` its text and ``prompt_ids`` its tokens (no pads), ``generated_ids`` the new tokens up to and
#: including the first end-of-text token (all ``max_new_tokens`` when none came), ``generated_text`` those
#: decoded without special tokens. Every hook entry applied to the prompt and to every generated token.
GENERATIONS = "generations.parquet"
GENERATE = "generate"
GENERATIONS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("step", _I64), pa.field("sample", _I64), pa.field("prompt", pa.string()),
    pa.field("prompt_ids", pa.list_(_I64)), pa.field("generated_ids", pa.list_(_I64)),
    pa.field("generated_text", pa.string()),
])

#: Files written once, at the end of the run, from hook entries' rows (``HookType.tables``), by name.
RUN_TOTAL_SCHEMAS = {UNITS: UNITS_SCHEMA, UNIT_EXAMPLES: UNIT_EXAMPLES_SCHEMA, UNIT_INPUTS: UNIT_INPUTS_SCHEMA,
                     STEER: STEER_SCHEMA, LENS: LENS_SCHEMA, GENERATIONS: GENERATIONS_SCHEMA}

#: What a row holds. Activations and module gradients come per call; ``param_grad`` per
#: parameter; ``saved`` is what autograd saved (as packed); ``patched`` is the stored value a
#: ``patch`` entry put in (the part its ``index`` selects); ``clipped`` is what a ``clamp`` entry
#: removed from a gradient (``grad - clamped``: ``1 - zero_frac`` is the fraction of elements clipped);
#: ``attribution`` is an ``attribution`` entry's estimate per index of dim 1 (``hooks.attribution``). A complex tensor gets two rows per
#: capture, one per part, with slots ``SLOT.real`` and ``SLOT.imag`` (its dtype column stays
#: complex; the statistics are those of the part, never of ``|z|``).
KINDS = ("input", "output", "grad_input", "grad_output", "param_grad", "saved", "patched", "clipped", "attribution")
#: Kinds whose first dimension is the batch and second the channels (``sample.batch`` and
#: ``sample.channels`` narrow them; parameter gradients have neither).
BATCH_KINDS = frozenset({"input", "output", "grad_input", "grad_output"})
#: When a row was recorded: during forward, during backward, after backward (accumulated
#: ``.grad``), in an evaluation pass, or while activation checkpointing recomputed a forward
#: inside backward (``recompute``: the same call again, not a new one).
PHASES = ("forward", "backward", "after_backward", "eval", "recompute")

#: The patching table (``runner.analysis.patching.patching_table``): one row per method, layer
#: (with ``path``: sender and ``receiver``) and index. ``method`` says how ``patched`` was found:
#: ``patch`` (a job that patched the output), ``path`` (a job that patched what a sender sends one
#: receiver), ``attribution`` (the first-order estimate of one attribution run), ``steer`` (a job that
#: added ``scale`` times a vector: ``patched`` steered, ``corrupted`` unsteered, no clean run, and ``kl``);
#: rows of runs stored before the column existed are ``patch``.
METHOD = "method"
METHODS = ("patch", "attribution", "path", "steer")
PATCHING_COLUMNS = (METHOD, "layer", "receiver", "index", "scale", "patched", "clean", "corrupted", "recovered", "kl")


@dataclass
class StepCaptures:
    """One step's captures as columns, what the recorder hands the writer: identifiers (``ID_COLUMNS``),
    statistics (``STAT_COLUMNS``) and the kept tensors with the rows they belong to."""

    columns: dict[str, list] = field(default_factory=dict)
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    kept_rows: list[int] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.columns.get("hook", ()))
