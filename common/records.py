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
#: The run-directory claim (``runner.store.lock``): held by the run writing there.
LOCK = ".runner.lock"
#: The run directory's TensorBoard event files: the export's and ``logger=tensorboard``'s.
EVENTS_DIR = "tensorboard"
#: Manifest key: the classes ``loss=class_score`` without ``target_class`` chose for step 0's samples.
EXPLAINED_CLASSES = "explained_classes"

#: Columns that identify one captured tensor, with their Arrow types, in output order. ``step``
#: is added by the writer; the recorder fills the others.
ID_FIELDS = (
    pa.field("step", pa.int64()),  #: step number, from 0
    pa.field("call", pa.int64()),  #: the n-th forward call of the module in the step (backward rows: the call they belong to)
    pa.field("hook", pa.string()),  #: the entry's name under ``hooks:``
    pa.field("layer", pa.string()),  #: qualified module name, ``""`` for the model itself
    pa.field("canonical", pa.string()),  #: the row's name in its transformer family's vocabulary (``blocks.3.resid_post``, ``blocks.3.mlp``: ``hooks.families``), the same in every family; null where the vocabulary names none
    pa.field("phase", pa.string()),  #: when the row was recorded: one of ``PHASES``
    pa.field("kind", pa.string()),  #: what the row holds: one of ``KINDS``
    pa.field("slot", pa.string()),  #: tuple position (``"0"``), dict key, dotted path, or parameter name (``"bias"``)
    pa.field("tensor_shape", pa.list_(pa.int64())),  #: the tensor's shape (not ``shape``, which pandas' ``DataFrame.shape`` would shadow)
    pa.field("dtype", pa.string()),  #: the tensor's dtype, ``float32``, ``complex64``, ...
    pa.field("numel", pa.int64()),  #: number of elements
)
#: The identifier columns the recorder fills (every ``ID_FIELDS`` name but ``step``).
ID_COLUMNS = tuple(f.name for f in ID_FIELDS if f.name != "step")

#: Statistic columns with their Arrow types (see ``hooks.kernels.stats.summarize`` for their meaning).
STAT_FIELDS = (
    pa.field("mean", pa.float64()),  #: mean of the elements (NaN if any is NaN)
    pa.field("std", pa.float64()),  #: sample standard deviation (``torch.std``)
    pa.field("min", pa.float64()),  #: smallest element
    pa.field("max", pa.float64()),  #: largest element
    pa.field("abs_mean", pa.float64()),  #: mean of the absolute values, finite for finite data
    pa.field("l2", pa.float64()),  #: L2 norm of the whole tensor
    pa.field("zero_frac", pa.float64()),  #: fraction of elements exactly 0
    pa.field("nan_count", pa.int64()),  #: number of NaN elements
    pa.field("inf_count", pa.int64()),  #: number of infinite elements
)
STAT_COLUMNS = tuple(f.name for f in STAT_FIELDS)
#: A kept tensor's values, flattened row-major as float32 (``tensor_shape`` restores it).
TENSOR_VALUES = pa.field("tensor_values", pa.large_list(pa.float32()))
#: "2": the tensor columns are ``tensor_shape`` and ``tensor_values`` (were ``shape`` and ``values``,
#: which pandas shadows with ``DataFrame.shape`` and ``DataFrame.values``).
SCHEMA_VERSION = "2"

STATS_SCHEMA = pa.schema(list(ID_FIELDS) + list(STAT_FIELDS))
#: - ``tensor_values``: the kept tensor, flattened row-major as float32 (``tensor_shape`` restores it)
TENSORS_SCHEMA = pa.schema(list(ID_FIELDS) + [TENSOR_VALUES])
#: A row of ``steps.parquet`` (one per step and split); ``STEP_METRICS`` follow as float64 columns.
STEP_FIELDS = (
    pa.field("step", pa.int64()),  #: step number, from 0
    pa.field("split", pa.string()),  #: ``train``, or ``eval`` for the eval batches run after that training step
    pa.field("loss", pa.float64()),  #: the step's loss (eval: the mean over the eval batches)
    pa.field("wall_time_s", pa.float64()),  #: forward, backward and the statistics' transfer, in seconds
    pa.field("captures", pa.int64()),  #: tensors the hooks captured in the step
    pa.field("peak_memory_bytes", pa.int64()),  #: the step's peak: resident-set high-water mark (CPU), max allocated (CUDA)
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


#: - ``accuracy``: of the batch (train) or of the held-out set (eval), with a classification loss
#: - ``logit``: the logit of ``metric.target`` at the last position, mean over the batch
#: - ``logit_diff``: the logit difference ``metric.diff`` names, mean over the batch
#: - ``clean_logit``: ``logit`` of the clean pass beside the step (``patch`` with ``source: clean``)
#: - ``clean_logit_diff``: ``logit_diff`` of the clean pass beside the step
#: - ``corrupted_logit``: ``logit`` of the unpatched corrupted pass beside the step
#: - ``corrupted_logit_diff``: ``logit_diff`` of the unpatched corrupted pass beside the step
STEPS_SCHEMA = steps_schema()
#: Each file's schema, by name.
TABLE_SCHEMAS = {STATS: STATS_SCHEMA, TENSORS: TENSORS_SCHEMA, STEPS: STEPS_SCHEMA}


#: ``units.parquet``: one row per (entry, layer, call, unit) of a ``units`` entry's run totals, in
#: columns that merge exactly across jobs (counts, Chan's ``(count, mean, M2)``, min, max, sketch
#: bucket counts, top-k candidates, sums of outer products: ``runner.analysis.load_units``).
_F64, _I64 = pa.float64(), pa.int64()
#: - ``hook``: the ``units`` entry's name
#: - ``layer``: qualified module name
#: - ``call``: the n-th call of the module within a step
#: - ``unit``: the unit's index along the entry's ``unit_axis`` (a conv output's channel)
#: - ``count``: how many values the unit saw (samples times positions)
#: - ``mean``: the running mean of those values (Chan's)
#: - ``m2``: their sum of squared deviations from ``mean`` (Chan's ``M2``; variance = ``m2 / count``)
#: - ``min``: the smallest value seen
#: - ``max``: the largest value seen
#: - ``threshold``: the entry's threshold ``above`` counts against
#: - ``above``: how many values exceeded ``threshold``
#: - ``top_k``: how many top and bottom candidates the entry keeps per unit
#: - ``relative_error``: the quantile sketch's relative error, for magnitudes in [``sketch_low``, ``sketch_high``]
#: - ``sketch_low``: magnitudes below it count as 0 in the sketch
#: - ``sketch_high``: magnitudes above it share the sketch's last bucket
#: - ``sketch_mapping``: the sketch's value-to-bucket mapping, by name
#: - ``sketch_index``: the sketch's non-empty bucket indices
#: - ``sketch_count``: the count of each bucket of ``sketch_index``
#: - ``top_value``: the largest values' candidates, largest first
#: - ``top_sample``: the sample id of each ``top_value``
#: - ``top_position``: the flat position of each ``top_value`` within ``position_shape``
#: - ``bottom_value``: the smallest values' candidates, smallest first
#: - ``bottom_sample``: the sample id of each ``bottom_value``
#: - ``bottom_position``: the flat position of each ``bottom_value`` within ``position_shape``
#: - ``position_shape``: the shape of the positions of one sample (``[h, w]`` for a conv map, ``[]`` for none)
#: - ``second_moment``: this unit's row of the layer's sum of x x^T over its units (``second_moment: true``; empty otherwise)
#: - ``named``: whether the sample ids are the data's own (dataset indices, ``run.samples`` ids); false where the data cannot say (an infinite random stream, e.g. ``data=randn``): the ids then only count the run's samples in order, never an index
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
    pa.field("named", pa.bool_()),
])
UNIT_COLUMNS = tuple(UNITS_SCHEMA.names)

#: ``unit_examples.parquet``: one row per (entry, layer, call, unit, rank) for the first ``examples`` top
#: samples of each unit (rank 0 the largest, in ``units.parquet``'s top order): the sample, its value and
#: position, and the unit's map at that sample from the run's own forward (``map_shape`` ``[h, w]``, the
#: positions max-pooled to at most 16 x 16 in float32, 1 KiB at most, so its peak is ``value``; empty for
#: a unit whose positions are not 2-D). What a picture of the top examples draws, never computed again.
UNIT_EXAMPLES = "unit_examples.parquet"
#: - ``hook``: the ``units`` entry's name
#: - ``layer``: qualified module name
#: - ``call``: the n-th call of the module within a step
#: - ``unit``: the unit's index
#: - ``rank``: the example's place among the unit's top samples, 0 the largest
#: - ``sample``: the sample id
#: - ``value``: the unit's largest value at that sample
#: - ``position``: the flat position of ``value`` within the unit's map
#: - ``map_shape``: the shape of ``map`` (``[h, w]``; empty when the positions are not 2-D)
#: - ``map``: the unit's map at that sample, max-pooled to at most 16 x 16, float32
#: - ``named``: whether the sample ids are the data's own (dataset indices, ``run.samples`` ids); false where the data cannot say (an infinite random stream, e.g. ``data=randn``): the ids then only count the run's samples in order, never an index
UNIT_EXAMPLES_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("layer", pa.string()), pa.field("call", _I64), pa.field("unit", _I64),
    pa.field("rank", _I64), pa.field("sample", _I64), pa.field("value", _F64), pa.field("position", _I64),
    pa.field("map_shape", pa.list_(_I64)), pa.field("map", pa.list_(pa.float32())), pa.field("named", pa.bool_()),
])
#: ``unit_inputs.parquet``: one row per (entry, sample) of ``unit_examples.parquet``: the model's input for
#: that sample as the run fed it: an image (``[C, H, W]`` floats) area-pooled to at most 64 x 64 in
#: ``input`` (float32, 48 KiB at most for RGB), or token ids (1-D integers) as they were in ``input_ids``;
#: other inputs are not kept (both empty). ``input_name`` and ``input_class``: the sample as its user knows it,
#: from the data, in every pass (``imagefolder``: the file's path under the folder and its class folder;
#: ``digits``: ``""`` and the digit's label; ``text``: the prompt; ``""`` where the data names none, the
#: sample id being its name); a sample with neither an input nor a name kept has no row.
UNIT_INPUTS = "unit_inputs.parquet"
#: - ``hook``: the ``units`` entry's name
#: - ``sample``: the sample id
#: - ``input_shape``: the shape of ``input`` (empty when none is kept)
#: - ``input``: the image the model was fed, area-pooled to at most 64 x 64, float32, flattened
#: - ``input_ids``: the token ids the model was fed (empty for other inputs)
#: - ``input_name``: the sample's name in the data (an ``imagefolder`` file's path under the folder), or ``""``
#: - ``input_class``: the sample's class in the data (an ``imagefolder`` file's class folder, a digit's label), or ``""``
#: - ``named``: whether the sample ids are the data's own (dataset indices, ``run.samples`` ids); false where the data cannot say (an infinite random stream, e.g. ``data=randn``): the ids then only count the run's samples in order, never an index
UNIT_INPUTS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("sample", _I64), pa.field("input_shape", pa.list_(_I64)),
    pa.field("input", pa.list_(pa.float32())), pa.field("input_ids", pa.list_(_I64)),
    pa.field("input_name", pa.string()), pa.field("input_class", pa.string()), pa.field("named", pa.bool_()),
])

#: ``steer.parquet``: one row per (entry, step, sample) of a ``steer`` entry: the next-token
#: distribution at the last position with the steering vector added (``steered_*``) and without it
#: (``unsteered_*``, a pass of the same batch beside the step), ``kl`` = KL(unsteered || steered) in nats.
STEER = "steer.parquet"
#: - ``method``: ``steer``
#: - ``hook``: the ``steer`` entry's name
#: - ``layers``: the modules the vector was added to
#: - ``scale``: the factor the vector was multiplied by
#: - ``step``: step number, from 0
#: - ``sample``: the sample's index in the batch
#: - ``kl``: KL(unsteered ‖ steered) of the next-token distributions at the last position, in nats
#: - ``steered_top_ids``: the most likely next tokens with the vector added, most likely first
#: - ``steered_top_probs``: their probabilities
#: - ``unsteered_top_ids``: the most likely next tokens without it, most likely first
#: - ``unsteered_top_probs``: their probabilities
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
#: - ``hook``: the ``logit_lens`` entry's name
#: - ``layer``: the block's qualified module name
#: - ``canonical``: its name in the family's vocabulary (``blocks.3``; ``hooks.mechanism.families``), the same across families
#: - ``block``: the block's number, from 0
#: - ``step``: step number, from 0
#: - ``sample``: the sample id: its index in the data (a prompt's), else (``data=tokens`` without a size) its place among the run's samples
#: - ``position``: the token position
#: - ``top_ids``: the ``top_k`` token ids the block's output reads as, most likely first
#: - ``top_logits``: their logits
#: - ``target``: the target token's id (the next token), -1 where there is none
#: - ``target_logit``: the target's logit
#: - ``target_prob``: the target's probability
#: - ``target_rank``: the target's rank, 0 = the top token
LENS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("layer", pa.string()), pa.field("canonical", pa.string()),
    pa.field("block", _I64), pa.field("step", _I64),
    pa.field("sample", _I64), pa.field("position", _I64), pa.field("top_ids", pa.list_(_I64)),
    pa.field("top_logits", pa.list_(_F64)), pa.field("target", _I64), pa.field("target_logit", _F64),
    pa.field("target_prob", _F64), pa.field("target_rank", _I64),
])

#: ``dla.parquet``: one row per (entry, step, sample, position, component) of a ``dla`` entry (``hooks.types.dla``):
#: ``contribution``, a part of the residual stream's share of ``logit_diff`` = logit[``target``] - logit[``other``]
#: (the model's own, beside each row) with the final norm's ``scale`` frozen. Components ``DLA_WHOLE`` sum to
#: ``logit_diff``; a block's ``head`` rows (``head`` its index, else -1) and its ``attn_bias`` sum to its ``attn``.
#: ``layer`` is the block's module name and ``block`` its place among the model's blocks ("" and -1 for the others).
DLA = "dla.parquet"
DLA_WHOLE = ("embed", "pos_embed", "attn", "mlp", "rest", "bias")
#: - ``hook``: the ``dla`` entry's name
#: - ``step``: step number, from 0
#: - ``sample``: the sample id: its index in the data (a prompt's), else (``data=tokens`` without a size) its place among the run's samples
#: - ``position``: the token position whose logits are split
#: - ``component``: the part: ``embed``, ``pos_embed``, ``attn``, ``mlp``, ``rest``, ``bias``, ``head`` or ``attn_bias``
#: - ``layer``: the block's qualified module name ("" for parts outside the blocks)
#: - ``canonical``: the part's module in the family's vocabulary (``blocks.3``, ``embed``; "" for ``rest``, ``bias``)
#: - ``block``: the block's number, from 0 (-1 for parts outside the blocks)
#: - ``head``: the attention head's index for ``head`` rows, else -1
#: - ``target``: the token id whose logit counts positively
#: - ``other``: the token id whose logit is subtracted
#: - ``contribution``: the part's share of ``logit_diff``, the final norm's scale frozen
#: - ``logit_diff``: the model's own logit[``target``] - logit[``other``] at this position
#: - ``scale``: the final norm's scale at this position (held fixed for every part)
DLA_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("step", _I64), pa.field("sample", _I64), pa.field("position", _I64),
    pa.field("component", pa.string()), pa.field("layer", pa.string()), pa.field("canonical", pa.string()),
    pa.field("block", _I64), pa.field("head", _I64), pa.field("target", _I64), pa.field("other", _I64), pa.field("contribution", _F64),
    pa.field("logit_diff", _F64), pa.field("scale", _F64),
])

#: ``generations.parquet``'s ``hook`` value: the run's generation (``mode=generate``), answered as an entry
#: of that name.
GENERATE = "generate"
#: ``generations.parquet``: one row per (step, prompt) of a ``mode=generate`` run (``runner.engine.generation``):
#: what ``model.generate`` made from the prompt with every hook entry applied at every call.
GENERATIONS = "generations.parquet"
#: - ``hook``: ``generate`` (the run's generation, not a hook entry)
#: - ``step``: step number, from 0 (one batch of prompts per step)
#: - ``sample``: the prompt's index in the data
#: - ``prompt``: the prompt's text
#: - ``prompt_ids``: the prompt's token ids, without pads
#: - ``generated_ids``: the new tokens, up to and including the first end-of-text token (all
#:   ``generate.max_new_tokens`` when none came)
#: - ``generated_text``: ``generated_ids`` decoded without special tokens
GENERATIONS_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("step", _I64), pa.field("sample", _I64), pa.field("prompt", pa.string()),
    pa.field("prompt_ids", pa.list_(_I64)), pa.field("generated_ids", pa.list_(_I64)),
    pa.field("generated_text", pa.string()),
])

#: ``graph_nodes.parquet``: one row per node of each prompt's attribution graph (``hooks.types.graph``), in
#: circuit-tracer's order: the active transcoder features (by layer, position, feature), one error node per layer
#: and position (``layer * n_positions + position`` after the features), one embedding per position, the logit
#: targets (most probable first). Position 0 has no active feature and its error nodes are zero, as circuit-tracer's.
GRAPH_NODES = "graph_nodes.parquet"
#: - ``hook``: the ``graph`` entry's name
#: - ``step``: step number, from 0
#: - ``sample``: the prompt's sample id: its index in the data, else its place among the run's samples
#: - ``node``: the node's index in the prompt's full (unpruned) graph, the ids ``graph_edges`` names
#: - ``kind``: ``feature``, ``error``, ``embedding`` or ``logit``
#: - ``layer``: the block whose transcoder the node is of (-1 for an embedding; the number of blocks for a logit)
#: - ``position``: the token position (a logit's: the last)
#: - ``feature``: the transcoder feature's index for a feature node, else -1
#: - ``token_id``: the input token at ``position`` (a logit's: the token it is the logit of)
#: - ``token``: ``token_id`` decoded by the entry's ``tokenizer`` (null without one)
#: - ``activation``: a feature's activation, a logit's value, 0 for errors and embeddings
#: - ``probability``: a logit's probability at the last position (null for other nodes)
#: - ``influence``: the node's cumulative influence on the logits, circuit-tracer's ``prune_graph`` score: the
#:   fraction of the graph's total influence held by the nodes at least as influential as this one
#: - ``kept``: whether pruning (``node_threshold``, ``edge_threshold``) keeps the node
GRAPH_NODES_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("step", _I64), pa.field("sample", _I64), pa.field("node", _I64),
    pa.field("kind", pa.string()), pa.field("layer", _I64), pa.field("position", _I64), pa.field("feature", _I64),
    pa.field("token_id", _I64), pa.field("token", pa.string()), pa.field("activation", _F64),
    pa.field("probability", _F64), pa.field("influence", _F64), pa.field("kept", pa.bool_()),
])

#: ``graph_edges.parquet``: one row per non-zero direct effect of a prompt's attribution graph that pruning keeps
#: (every non-zero one with the entry's ``keep_all``): ``weight`` = the source's activation (a feature's; an error
#: node's and an embedding's vector) times the gradient of the target's pre-activation (a feature's encoder input
#: times its encoder row; a logit's value minus the mean logit), attention patterns and norm scales frozen.
GRAPH_EDGES = "graph_edges.parquet"
#: - ``hook``: the ``graph`` entry's name
#: - ``step``: step number, from 0
#: - ``sample``: the prompt's sample id, as in ``graph_nodes``
#: - ``source``: the node whose effect it is (``graph_nodes.node``)
#: - ``target``: the node it acts on (``graph_nodes.node``)
#: - ``weight``: the direct effect of ``source`` on ``target``'s pre-activation
#: - ``kept``: whether pruning keeps the edge (false only in a ``keep_all`` entry's rows)
GRAPH_EDGES_SCHEMA = pa.schema([
    pa.field("hook", pa.string()), pa.field("step", _I64), pa.field("sample", _I64), pa.field("source", _I64),
    pa.field("target", _I64), pa.field("weight", _F64), pa.field("kept", pa.bool_()),
])

#: Files written once, at the end of the run, from hook entries' rows (``HookType.tables``), by name.
RUN_TOTAL_SCHEMAS = {UNITS: UNITS_SCHEMA, UNIT_EXAMPLES: UNIT_EXAMPLES_SCHEMA, UNIT_INPUTS: UNIT_INPUTS_SCHEMA,
                     STEER: STEER_SCHEMA, LENS: LENS_SCHEMA, DLA: DLA_SCHEMA, GENERATIONS: GENERATIONS_SCHEMA,
                     GRAPH_NODES: GRAPH_NODES_SCHEMA, GRAPH_EDGES: GRAPH_EDGES_SCHEMA}

#: What a row holds. Activations and module gradients come per call; ``param_grad`` per
#: parameter; ``saved`` is what autograd saved (as packed); ``patched`` is the stored value a
#: ``patch`` entry put in (the part its ``index`` selects); ``clipped`` is what a ``clamp`` entry
#: removed from a gradient (``grad - clamped``: ``1 - zero_frac`` is the fraction of elements clipped);
#: ``attribution`` is an ``attribution`` entry's estimate per index of dim 1 (``hooks.types.attribution``). A complex tensor gets two rows per
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
