"""``units``: per-unit statistics of layer outputs over a whole pass, written as ``units.parquet``.

A forward hook on each selected module folds every call's output (one tensor: ``slot``) into
a ``hooks.unit_stats.UnitStats`` per (layer, call within the step): count, mean, variance
(Chan-mergeable ``M2``), min, max, the count above ``threshold``, a quantile sketch of relative
error ``relative_error``, the ``top_k`` / bottom-k samples with their values, sample ids and
positions, and with ``second_moment: true`` the sum of the layer's outer products. The unit
axis is ``unit_axis`` (null: dim 1 of outputs with 4 or more dims, the channels; the last dim
otherwise, the features of a linear or transformer output); the other dims after the batch are
positions. Sample ids: ``hooks.samples`` (dataset indices in a whole-dataset pass). Nothing goes to ``stats.parquet``: ``tables()`` hands
the run's totals to the writer once, at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from common.errors import ConfigError
from common.records import UNIT_COLUMNS, UNITS
from hooks.registry import register
from hooks.samples import SampleOutputs, SampleOutputsSpec
from hooks.unit_stats import SketchGrid, UnitStats, default_unit_axis

FLOAT32 = torch.finfo(torch.float32)


#: The columns of ``units.parquet`` (types: ``common.records.UNITS_SCHEMA``).


@dataclass
class UnitsSpec(SampleOutputsSpec):
    """Keys of a ``units`` entry (see the module docstring)."""

    unit_axis: Optional[int] = None       #: null: 1 for outputs of 4+ dims, the last dim otherwise
    threshold: float = 0.0                #: ``above`` counts values > threshold (dead fraction: 1 - above/count)
    top_k: int = 16                       #: top and bottom samples kept per unit
    relative_error: float = 0.01          #: of the quantile sketch, for magnitudes in [sketch_low, sketch_high]
    sketch_low: float = 1e-6              #: magnitudes below count as 0 (absolute error < sketch_low)
    sketch_high: float = 1e6              #: magnitudes above share the last bucket
    second_moment: bool = False           #: the sum of x x^T over the layer's units (covariance, PCA)

    def check(self, key: str) -> None:
        if self.top_k < 0:
            raise ConfigError(f"{key}.top_k: {self.top_k} must be >= 0")
        if not 1e-6 <= self.relative_error < 1:
            raise ConfigError(f"{key}.relative_error: {self.relative_error} must be in [1e-6, 1), e.g. 0.01")
        if not FLOAT32.tiny <= self.sketch_low <= FLOAT32.max:
            raise ConfigError(f"{key}.sketch_low: {self.sketch_low} must be in [{FLOAT32.tiny:g}, {FLOAT32.max:g}] "
                              f"(the sketch buckets float32 magnitudes), e.g. 1e-6")
        if not self.sketch_low < self.sketch_high <= FLOAT32.max:
            raise ConfigError(f"{key}.sketch_high: {self.sketch_high} must be above sketch_low={self.sketch_low} "
                              f"and at most {FLOAT32.max:g} (the sketch buckets float32 magnitudes), e.g. 1e6")


@register("units")
class Units(SampleOutputs):
    """Streams per-unit statistics of the selected modules' outputs; changes nothing."""

    spec_class = UnitsSpec
    writes = (UNITS,)

    def __init__(self, name: str, spec: UnitsSpec) -> None:
        super().__init__(name, spec)
        self.grid = SketchGrid(spec.relative_error, spec.sketch_low, spec.sketch_high)
        self.stats: dict[tuple[str, int], UnitStats] = {}
        self._calls: dict[str, int] = {}
        self._calls_step = -1

    @property
    def eval_problem(self) -> str | None:
        return "sums over the run's own pass; eval passes would mix other samples into it"

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
                _position_shape(x, self._axis(x)))
        stats.update(view, samples)

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
                                         self.spec.second_moment)
                    for shapes in self.planned.values() for shape in shapes)
        return {"unit statistics": total} if total else {}

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
        return {UNITS: columns}

    def run_state(self) -> dict:
        return {**super().run_state(), "stats": {key: stats.state() for key, stats in self.stats.items()},
                "shapes": {key: (stats.units, stats.position_shape) for key, stats in self.stats.items()}}

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
                                                self.spec.second_moment, positions)
            stats.restore(values)


def _position_shape(x: torch.Tensor, axis: int) -> list[int]:
    return [d for i, d in enumerate(x.shape) if i not in (0, axis)]
