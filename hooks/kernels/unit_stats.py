"""Per-unit running statistics of one layer, streamed batch by batch in float64 and mergeable exactly.

``UnitStats`` keeps, per unit (a channel of a conv output, a feature of a linear or transformer
output), everything ``units.parquet`` holds: the count, Chan's ``(mean, M2)`` pair (each batch's
own mean and M2 in float64, from sums around the unit's running mean (C kernel) or two-pass
(eager), then merged with Chan et al.'s parallel update, so variances do not suffer the
cancellation of a plain sum of squares), min, max, the count above a
threshold, a relative-error quantile sketch, the top-k / bottom-k samples, and optionally the
sum of the layer's outer products (second moment, for covariance and PCA).

The sketch grid, Chan's merge and the top-k order are the file's format, written and read with
the same rules: ``common.unit_sketch``. A sample's value is its maximum (top) or minimum (bottom)
over positions (pixels, tokens), with the first position where it is reached. For the first
``examples`` top samples of each unit it also keeps the unit's map at that sample (``top_map``:
the positions max-pooled to at most ``MAP_SIDE`` x ``MAP_SIDE`` in float32, so the map's peak is the
sample's value), for units whose positions are 2-D (a conv channel): what a picture of the top
examples draws, taken from the run's own weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from common.unit_sketch import SketchGrid, chan_merge, default_unit_axis, ranked  # noqa: F401  (default_unit_axis: hooks.types.steer's)
from hooks.kernels import native

STATE_KEYS = ("count", "mean", "m2", "min", "max", "above", "sketch", "top_value", "top_sample", "top_position",
              "bottom_value", "bottom_sample", "bottom_position", "second", "top_map")
#: A kept map's largest side: the positions are max-pooled to at most ``MAP_SIDE`` x ``MAP_SIDE`` (float32).
MAP_SIDE = 16


def map_shape(position_shape: list[int]) -> list[int]:
    """The shape of a kept map of a unit with ``position_shape`` positions: 2-D ones pooled to at most
    ``MAP_SIDE`` a side; other units have no map (``[]``)."""
    return [min(side, MAP_SIDE) for side in position_shape] if len(position_shape) == 2 else []


class UnitStats:
    """The running statistics of ``units`` units; ``update(x, samples)`` with ``x`` as ``[batch, units, positions]``."""

    def __init__(self, units: int, k: int, threshold: float, grid: SketchGrid, second_moment: bool,
                 position_shape: list[int], examples: int = 0) -> None:
        self.units, self.k, self.threshold, self.grid = units, k, threshold, grid
        self.position_shape = list(position_shape)
        self.map_shape = map_shape(self.position_shape)
        #: how many of the first top samples keep their map (none for a unit without one)
        self.examples = min(examples, k) if self.map_shape else 0
        f64, i64 = torch.float64, torch.int64
        self.count = 0
        self.mean = torch.zeros(units, dtype=f64)
        self.m2 = torch.zeros(units, dtype=f64)
        self.min = torch.full((units,), math.inf, dtype=f64)
        self.max = torch.full((units,), -math.inf, dtype=f64)
        self.above = torch.zeros(units, dtype=i64)
        self.sketch = torch.zeros(units, grid.size, dtype=i64)
        self._sketch_shared = False  # True once ``state()`` handed the sketch out: copy before adding to it
        empty_v, empty_i = torch.empty(0, units, dtype=f64), torch.empty(0, units, dtype=i64)
        self.top_value, self.top_sample, self.top_position = empty_v, empty_i, empty_i
        self.bottom_value, self.bottom_sample, self.bottom_position = empty_v, empty_i, empty_i
        self.second = torch.zeros(units, units, dtype=f64) if second_moment else None
        self.top_map = torch.empty(0, units, math.prod(self.map_shape), dtype=torch.float32)

    @staticmethod
    def held_bytes(units: int, k: int, grid_size: int, second_moment: bool, map_values: int = 0) -> int:
        """The bytes of the tensors a ``UnitStats`` holds once ``k`` samples were seen: mean, M2, min,
        max (float64), above and the sketch (int64), top and bottom ``k`` values, samples and
        positions, the ``units x units`` second moment (float64), and ``map_values`` float32 values
        of kept maps per unit."""
        return 8 * units * (4 + 1 + grid_size + 6 * k + (units if second_moment else 0)) + 4 * units * map_values

    def update(self, x: torch.Tensor, samples: torch.Tensor) -> None:
        """Fold in one batch ``x`` of shape ``[batch, units, positions]``; ``samples``: the batch's sample ids.

        CPU float tensors take one pass of the C kernel (``units_kernel.c``), which reads ``x`` as it is
        (no float64 copy) and sums each (sample, unit) row in double; other tensors, or a machine
        without a C compiler, take eager PyTorch passes over a float64 copy. Both give the same
        statistics: the kernel's sums run around the unit's running mean, so ``M2`` does not cancel.
        """
        x = x.detach()
        if x.numel() == 0:
            return
        kernel = native.units_kernel() if x.device.type == "cpu" and x.is_floating_point() else None
        if kernel is None:
            per_sample = self._eager(x)
        else:
            per_sample = self._kernel(kernel, x if x.dtype in (torch.float32, torch.float64) else x.float())
        samples = samples.to(torch.int64).cpu().view(-1, 1).expand(-1, self.units)
        top_value, top_position, bottom_value, bottom_position = per_sample
        kept = len(self.top_value)
        self.top_value, self.top_sample, self.top_position, rows = best(
            self.k, True, (self.top_value, self.top_sample, self.top_position), (top_value, samples, top_position))
        self.bottom_value, self.bottom_sample, self.bottom_position, _ = best(
            self.k, False, (self.bottom_value, self.bottom_sample, self.bottom_position),
            (bottom_value, samples, bottom_position))
        if self.examples:
            self._keep_maps(x, rows[:self.examples], kept)
        if self.second is not None:
            flat = x.to(torch.float64).transpose(1, 2).reshape(-1, self.units)
            self.second = self.second + flat.T @ flat

    def _keep_maps(self, x: torch.Tensor, rows: torch.Tensor, kept: int) -> None:
        """The maps of the first top samples (``rows``: ``[examples, units]`` indices into the kept rows,
        then the batch's): a kept one's map stays, a new one's is pooled from ``x``, only where needed."""
        new = rows >= kept
        maps = torch.empty(*rows.shape, self.top_map.shape[2], dtype=torch.float32)
        if len(self.top_map):  # a kept sample among the first ones was among them before (the order is total)
            old = rows.clamp(max=len(self.top_map) - 1)
            maps[~new] = self.top_map.gather(0, old.unsqueeze(2).expand(-1, -1, maps.shape[2]))[~new]
        slot, unit = new.nonzero(as_tuple=True)
        if len(slot):
            picked = x[(rows[slot, unit] - kept).to(x.device), unit.to(x.device)].detach().to("cpu", torch.float32)
            pooled = F.adaptive_max_pool2d(picked.view(-1, 1, *self.position_shape), self.map_shape)
            maps[slot, unit] = pooled.reshape(len(slot), -1)
        self.top_map = maps

    def _kernel(self, kernel, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The batch's moments, extremes, count above and sketch from the C kernel; its per-sample
        maxima and minima with their positions, each ``[batch, units]``."""
        x = x.contiguous()
        batch, positions = x.shape[0], x.shape[2]
        # around a finite shift: an infinite one would make every difference infinite or NaN
        shift = torch.nan_to_num(self.mean if self.count else x[0, :, 0].to(torch.float64), 0.0, 0.0, 0.0).contiguous()
        f64, i64 = torch.float64, torch.int64
        sum1, sum2, above = (torch.empty(self.units, dtype=t) for t in (f64, f64, i64))
        lo, hi, at_lo, at_hi = (torch.empty(batch, self.units, dtype=t) for t in (f64, f64, i64, i64))
        if self._sketch_shared:  # copy on write: ``state()`` handed this sketch out
            self.sketch, self._sketch_shared = self.sketch.clone(), False
        g = self.grid
        kernel(x.data_ptr(), x.dtype == f64, batch, self.units, positions, shift.data_ptr(), self.threshold,
               g.low32, g.multiplier, g.first, g.last, g.side, self.sketch.data_ptr(), sum1.data_ptr(), sum2.data_ptr(),
               above.data_ptr(), lo.data_ptr(), hi.data_ptr(), at_lo.data_ptr(), at_hi.data_ptr())
        n = batch * positions
        self._merge_moments(n, shift + sum1 / n, (sum2 - sum1 * sum1 / n).clamp_(min=0))
        self.min = torch.minimum(self.min, lo.amin(0))
        self.max = torch.maximum(self.max, hi.amax(0))
        self.above = self.above + above
        return hi, at_hi, lo, at_lo

    def _eager(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``_kernel``'s work in eager PyTorch passes over a float64 copy of ``x``."""
        x = x.to("cpu", torch.float64).transpose(1, 2)
        flat = x.reshape(-1, self.units)
        batch_mean = flat.mean(0)
        centred = flat - batch_mean
        self._merge_moments(flat.shape[0], batch_mean, (centred * centred).sum(0))
        self.min = torch.minimum(self.min, flat.amin(0))
        self.max = torch.maximum(self.max, flat.amax(0))
        self.above = self.above + (flat > self.threshold).sum(0)
        buckets = torch.from_numpy(self.grid.index(flat.numpy())) + torch.arange(self.units) * self.grid.size
        self.sketch = self.sketch + torch.bincount(buckets.reshape(-1), minlength=self.units * self.grid.size).view(
            self.units, self.grid.size)
        top, top_position = x.max(1)
        bottom, bottom_position = x.min(1)
        return top, top_position, bottom, bottom_position

    def _merge_moments(self, n: int, mean: torch.Tensor, m2: torch.Tensor) -> None:
        """Chan et al.'s parallel update of ``(count, mean, M2)`` with another part's."""
        self.count, self.mean, self.m2 = chan_merge(self.count, self.mean, self.m2, n, mean, m2)

    def state(self) -> dict[str, object]:
        """Every accumulator by name (``STATE_KEYS``): what a resumed run goes on from. ``update``
        replaces the tensors rather than changing them in place, except the sketch, which the kernel
        adds to and copies first once handed out here: a snapshot without a copy."""
        self._sketch_shared = True
        return {key: getattr(self, key) for key in STATE_KEYS}

    def restore(self, state: dict[str, object]) -> None:
        for key in STATE_KEYS:
            setattr(self, key, state[key])
        self._sketch_shared = True


def best(k: int, largest: bool, kept: tuple, new: tuple) -> tuple:
    """The ``k`` best of ``kept`` and ``new`` (each ``(values, samples, positions)`` as ``[rows, units]``) in
    the top-k order (``common.unit_sketch.ranked``), and the rows they came from (``kept``'s, then ``new``'s)."""
    values, samples, positions = (torch.cat([a, b]) for a, b in zip(kept, new))
    order = torch.from_numpy(ranked(values.numpy(), samples.numpy(), largest)[:k])
    return (*(t.gather(0, order) for t in (values, samples, positions)), order)
