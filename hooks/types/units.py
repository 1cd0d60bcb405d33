"""``units``: per-unit statistics of layer outputs over a whole pass, written as ``units.parquet``.

A forward hook on each selected module folds every call's output (one tensor: ``slot``) into
a ``hooks.kernels.unit_stats.UnitStats`` per (layer, call within the step): count, mean, variance
(Chan-mergeable ``M2``), min, max, the count above ``threshold``, a quantile sketch of relative
error ``relative_error``, the ``top_k`` / bottom-k samples with their values, sample ids and
positions, and with ``second_moment: true`` the sum of the layer's outer products. The unit
axis is ``unit_axis`` (null: dim 1 of outputs with 4 or more dims, the channels; the last dim
otherwise, the features of a linear or transformer output); the other dims after the batch are
positions. Sample ids: ``hooks.types.samples`` (the data's own indices in every pass whose data know their
items, shuffled or not; column ``named`` false where the data cannot say and the ids only count the
run's samples). Nothing goes to ``stats.parquet``: ``tables()`` hands the run's totals to the writer
once, at the end.

What a picture of a unit's top examples needs is kept by this run, which saw them with its own
weights: for the first ``examples`` top samples of each unit, the unit's map at the sample
(``unit_examples.parquet``: ``hooks.kernels.unit_stats``) and the model's input for the sample
(``unit_inputs.parquet``: an image pooled to at most ``INPUT_SIDE`` a side, or token ids), read by a
forward pre-hook on the model itself, with the sample's name and class as its user knows them where the
data give them (``Recorder.sample_names``: an ``imagefolder`` file's path and class folder, a digit's
class, a prompt). The first
``examples`` of the top-k at the end were among the first ``examples`` from the moment they were seen (a sample leaves them only for larger ones), so
keeping those few is exact.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common.errors import ConfigError
from common.records import UNIT_COLUMNS, UNIT_EXAMPLES, UNIT_EXAMPLES_SCHEMA, UNIT_INPUTS, UNITS
from common.unit_sketch import SketchGrid, default_unit_axis
from hooks.mechanism.registry import register
from hooks.types.samples import SampleOutputs
from hooks.kernels.unit_stats import UnitStats, map_shape
from hooks.specs.units import UnitsSpec

#: A kept image input's largest side: ``[C, H, W]`` inputs are area-pooled to at most this (float32).
INPUT_SIDE = 64


@register("units")
class Units(SampleOutputs):
    """Streams per-unit statistics of the selected modules' outputs; changes nothing."""

    spec_class = UnitsSpec
    writes = (UNITS, UNIT_EXAMPLES, UNIT_INPUTS)

    def __init__(self, name: str, spec: UnitsSpec) -> None:
        super().__init__(name, spec)
        self.grid = SketchGrid(spec.relative_error, spec.sketch_low, spec.sketch_high)
        self.examples = min(spec.examples, spec.top_k)  #: the first top samples whose map and input are kept
        self.stats: dict[tuple[str, int], UnitStats] = {}
        self._calls: dict[str, int] = {}
        self._calls_step = -1
        self._input: torch.Tensor | None = None  # the model's input of the current forward
        #: kept inputs by sample id: ``(shape, image values or None, token ids or None, name, class)``
        #: (``input_kept``, ``Recorder.sample_names``); ``None`` where neither is known
        self.inputs: dict[int, tuple[list[int], torch.Tensor | None, torch.Tensor | None, str, str] | None] = {}
        self._inputs_bound = 64  # prune unreferenced inputs when there are more than this

    def attach(self, model: nn.Module, session) -> None:
        super().attach(model, session)
        if self.examples:
            session.add(model.register_forward_pre_hook(self._see_input, with_kwargs=True))
            session.add(model.register_forward_hook(self._forget_input, always_call=True))

    def _see_input(self, module, args, kwargs) -> None:
        """Note the model's input (a positional tensor, else ``input_ids`` or another keyword's) for ``take``."""
        given = [a for a in args if isinstance(a, torch.Tensor)]
        given += [kwargs[k] for k in sorted(kwargs, key=lambda k: k != "input_ids") if isinstance(kwargs[k], torch.Tensor)]
        self._input = given[0] if given else None

    def _forget_input(self, module, args, output) -> None:
        """The forward ended (or raised): a layer called outside the model's forward has no input here."""
        self._input = None

    eval_problem = "sums over the run's own pass; eval passes would mix other samples into it"

    def check(self, layer: str, x: torch.Tensor) -> None:
        self._units_view(layer, x)

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        if self.session.step != self._calls_step:
            self._calls_step, self._calls = self.session.step, {}
        call = self._calls.get(layer, 0)
        self._calls[layer] = call + 1
        view = self._units_view(layer, x)
        stats = self.stats.get((layer, call))
        if stats is None:
            stats = self.stats[(layer, call)] = UnitStats(
                view.shape[1], self.spec.top_k, self.spec.threshold, self.grid, self.spec.second_moment,
                _position_shape(x, self._axis(x)), self.examples)
        stats.update(view, samples)
        self._keep_inputs(stats, samples)

    def _keep_inputs(self, stats: UnitStats, samples: torch.Tensor) -> None:
        """The inputs and names of this batch's samples that are now among a unit's first ``examples`` top samples."""
        recorder = self.session.recorder  # names are of dataset indices: of none where the ids are a count
        batch, names = self._input, recorder.sample_names if recorder.samples is not None else None
        if batch is not None and (batch.is_meta or batch.dim() == 0 or len(batch) != len(samples)):
            batch = None  # not the batch these rows came from
        if not self.examples or (batch is None and names is None):
            return
        wanted = set(stats.top_sample[:self.examples].unique().tolist()) - self.inputs.keys()
        for row, sample in enumerate(samples.tolist()):
            if sample in wanted:
                kept = input_kept(batch[row]) if batch is not None else None
                name, label = names(sample) if names is not None else ("", "")
                self.inputs[sample] = (*(kept or ([], None, None)), name, label) if kept or name or label else None
        if len(self.inputs) > self._inputs_bound:
            referenced = self._referenced()
            self.inputs = {s: kept for s, kept in self.inputs.items() if s in referenced}
            self._inputs_bound = max(64, 2 * len(self.inputs))

    def _referenced(self) -> set[int]:
        return {s for stats in self.stats.values() for s in stats.top_sample[:self.examples].unique().tolist()}

    def _axis(self, x: torch.Tensor) -> int:
        return self._axis_of(x.dim())

    def _axis_of(self, dims: int) -> int:
        axis = self.spec.unit_axis
        if axis is None:
            return default_unit_axis(dims)
        return axis % dims if -dims <= axis < dims else axis

    def _units_view(self, layer: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``[batch, units, positions]``: a conv output's ``[batch, channels, pixels]`` without a copy."""
        axis = self._axis(x)
        if x.dim() < 2 or not 1 <= axis < x.dim():
            raise ConfigError(f"{self.key}.unit_axis: {self.spec.unit_axis} is not a dim after the batch of "
                              f"{layer}'s output of shape {list(x.shape)}; valid: 1..{x.dim() - 1}")
        return x.movedim(axis, 1).reshape(x.shape[0], x.shape[axis], -1)

    def held_bytes(self) -> dict[str, int]:
        """The statistics of every (layer, call) it will keep, once ``top_k`` samples were seen."""
        total = sum(UnitStats.held_bytes(shape[self._axis_of(len(shape))], self.spec.top_k, self.grid.size,
                                         self.spec.second_moment, self._map_values(shape))
                    for shapes in self.planned.values() for shape in shapes)
        return {"unit statistics": total} if total else {}

    def _map_values(self, shape: torch.Size) -> int:
        """The float32 values of the maps kept per unit of an output of ``shape``."""
        axis = self._axis_of(len(shape))
        kept = map_shape([d for i, d in enumerate(shape) if i not in (0, axis)])
        return self.examples * math.prod(kept) if kept else 0

    def tables(self) -> dict[str, dict[str, list]]:
        """``units.parquet``'s rows of this entry, one per (layer, call, unit), as columns."""
        self.report_unseen({layer for layer, _ in self.stats})
        columns: dict[str, list] = {name: [] for name in UNIT_COLUMNS}
        for (layer, call), stats in self.stats.items():
            n = stats.units
            columns["hook"] += [self.name] * n
            columns["layer"] += [layer] * n
            columns["call"] += [call] * n
            columns["unit"] += range(n)
            columns["count"] += [stats.count] * n
            columns["position_shape"] += [stats.position_shape] * n
            columns["threshold"] += [self.spec.threshold] * n
            columns["top_k"] += [self.spec.top_k] * n
            columns["relative_error"] += [self.spec.relative_error] * n
            columns["sketch_low"] += [self.spec.sketch_low] * n
            columns["sketch_high"] += [self.spec.sketch_high] * n
            columns["sketch_mapping"] += [SketchGrid.MAPPING] * n
            for key in ("mean", "m2", "min", "max", "above"):
                columns[key] += getattr(stats, key).tolist()
            nonzero = [row.nonzero().view(-1) for row in stats.sketch]
            columns["sketch_index"] += [i.tolist() for i in nonzero]
            columns["sketch_count"] += [row[i].tolist() for row, i in zip(stats.sketch, nonzero)]
            for key in ("top_value", "top_sample", "top_position", "bottom_value", "bottom_sample",
                        "bottom_position"):
                columns[key] += getattr(stats, key).T.tolist()
            columns["second_moment"] += [[] for _ in range(n)] if stats.second is None else stats.second.tolist()
            columns["named"] += [self.named] * n
        return {UNITS: columns, UNIT_EXAMPLES: self._examples_table(), UNIT_INPUTS: self._inputs_table()}

    def _examples_table(self) -> dict[str, list]:
        """``unit_examples.parquet``'s rows: each unit's first ``examples`` top samples with their maps."""
        columns: dict[str, list] = {name: [] for name in UNIT_EXAMPLES_SCHEMA.names}
        for (layer, call), stats in self.stats.items():
            ranks = min(self.examples, len(stats.top_value))
            for rank in range(ranks):
                n = stats.units
                columns["hook"] += [self.name] * n
                columns["layer"] += [layer] * n
                columns["call"] += [call] * n
                columns["unit"] += range(n)
                columns["rank"] += [rank] * n
                columns["sample"] += stats.top_sample[rank].tolist()
                columns["value"] += stats.top_value[rank].tolist()
                columns["position"] += stats.top_position[rank].tolist()
                mapped = rank < len(stats.top_map)
                columns["map_shape"] += [stats.map_shape if mapped else []] * n
                columns["map"] += stats.top_map[rank].tolist() if mapped else [[] for _ in range(n)]
                columns["named"] += [self.named] * n
        return columns

    def _inputs_table(self) -> dict[str, list]:
        """``unit_inputs.parquet``'s rows: the kept input and name of every sample ``unit_examples.parquet`` names."""
        referenced = self._referenced()
        kept = sorted(s for s in self.inputs if s in referenced and self.inputs[s] is not None)
        return {"hook": [self.name] * len(kept), "sample": kept,
                "input_shape": [self.inputs[s][0] for s in kept],
                **{column: [[] if self.inputs[s][i] is None else self.inputs[s][i].tolist() for s in kept]
                   for i, column in ((1, "input"), (2, "input_ids"))},
                **{column: [self.inputs[s][i] for s in kept] for i, column in ((3, "input_name"), (4, "input_class"))},
                "named": [self.named] * len(kept)}

    def run_state(self) -> dict:
        return {**super().run_state(), "stats": {key: stats.state() for key, stats in self.stats.items()},
                "shapes": {key: (stats.units, stats.position_shape) for key, stats in self.stats.items()},
                "inputs": dict(self.inputs)}

    def restore_run_state(self, state: dict) -> None:
        super().restore_run_state(state)
        for key, values in state.get("stats", {}).items():
            units, positions = state["shapes"][key]
            if tuple(values["sketch"].shape) != (units, self.grid.size):  # the kernel would write past its rows
                raise ConfigError(f"{self.key}: the saved state of layer '{key[0]}' holds sketches of "
                                  f"{values['sketch'].shape[1]} buckets where this entry's layout has "
                                  f"{self.grid.size} (saved by another version or with other sketch "
                                  f"settings); run the pass again in a new directory")
            stats = self.stats[key] = UnitStats(units, self.spec.top_k, self.spec.threshold, self.grid,
                                                self.spec.second_moment, positions, self.examples)
            stats.restore(values)
        self.inputs = dict(state.get("inputs", {}))


def _position_shape(x: torch.Tensor, axis: int) -> list[int]:
    return [d for i, d in enumerate(x.shape) if i not in (0, axis)]


def input_kept(x: torch.Tensor) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None] | None:
    """One sample's model input as ``unit_inputs.parquet`` keeps it: ``(shape, values, None)`` for an
    image (``[C, H, W]`` floats, area-pooled to at most ``INPUT_SIDE`` a side), ``(shape, None, ids)``
    for token ids (1-D integers); ``None`` for any other input (not kept)."""
    x = x.detach()
    if x.is_floating_point() and x.dim() == 3:
        side = [min(d, INPUT_SIDE) for d in x.shape[1:]]
        pooled = F.adaptive_avg_pool2d(x.to("cpu", torch.float32)[None], side)[0]
        return list(pooled.shape), pooled.reshape(-1), None
    if not x.is_floating_point() and not x.is_complex() and x.dim() == 1:
        return [len(x)], None, x.to("cpu", torch.int64, copy=True)
    return None
