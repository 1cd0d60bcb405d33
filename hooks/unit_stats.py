"""Per-unit running statistics of one layer, streamed batch by batch in float64 and mergeable exactly.

``UnitStats`` keeps, per unit (a channel of a conv output, a feature of a linear or transformer
output), everything ``units.parquet`` holds: the count, Chan's ``(mean, M2)`` pair (each batch's
own mean and M2 in float64, from sums around the unit's running mean (C kernel) or two-pass
(eager), then merged with Chan et al.'s parallel update, so variances do not suffer the
cancellation of a plain sum of squares), min, max, the count above a
threshold, a relative-error quantile sketch, the top-k / bottom-k samples, and optionally the
sum of the layer's outer products (second moment, for covariance and PCA).

The quantile sketch is DDSketch (Masson et al., VLDB 2019) with its linearly interpolated mapping
(``SketchGrid``): each bucket spans magnitudes whose ratio is at most ``gamma = (1 + a) / (1 - a)``,
so its representative is within relative error ``a`` of every value in it. Counts add, so
sketches of shards merge exactly. Magnitudes below ``low`` share one zero bucket (estimated as 0:
absolute error < ``low``) and magnitudes above ``high`` the last bucket.

Top-k order: by value (descending for top, ascending for bottom), ties by the lower sample id,
so the sets are the same whatever the batching or the sharding. A sample's value is its
maximum (top) or minimum (bottom) over positions (pixels, tokens), with the first position
where it is reached.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from hooks import native

STATE_KEYS = ("count", "mean", "m2", "min", "max", "above", "sketch", "top_value", "top_sample", "top_position",
              "bottom_value", "bottom_sample", "bottom_position", "second")


def default_unit_axis(dims: int) -> int:
    """The unit axis of an output of ``dims`` dims: 1 (the channels) from 4 dims on, else the last (features)."""
    return 1 if dims >= 4 else dims - 1


class SketchGrid:
    """The bucket layout shared by every unit of a run: ``2 K + 1`` buckets, the zero bucket in the middle.

    A magnitude is bucketed as float32: its bit pattern ``b`` (an integer, piecewise linear in
    ``log2``) gives the key ``floor(b * multiplier)``, DDSketch's linearly interpolated mapping.
    A bucket then spans magnitudes whose ratio is at most ``1 + 1 / c + 2**-23`` (``c`` buckets per
    octave), and ``multiplier = c / 2**23`` is chosen so that this is ``gamma``: the representative
    ``2 lo hi / (lo + hi)`` is within ``relative_error`` of every magnitude in ``[lo, hi)``. It costs
    the C kernel one product and a floor per value, where the exact logarithm cost a lookup.
    """

    #: ``units.parquet``'s ``sketch_mapping``: files with another mapping are refused, not misread
    MAPPING = "float32-linear"

    def __init__(self, relative_error: float, low: float, high: float) -> None:
        self.relative_error, self.low, self.high = relative_error, low, high
        gamma = (1 + relative_error) / (1 - relative_error)
        self.multiplier = 1 / (gamma - 1 - 2.0 ** -23) / 2.0 ** 23
        #: the zero bucket holds magnitudes below ``low32``, the largest float32 not above ``low``
        self.low32 = float(np.nextafter(np.float32(low), np.float32(0)) if np.float32(low) > low else np.float32(low))
        self.first, self.last = (int(self.key(torch.tensor([v], dtype=torch.float32))) for v in (self.low32, high))
        self.side = self.last - self.first + 1
        self.size = 2 * self.side + 1

    def key(self, magnitude: torch.Tensor) -> torch.Tensor:
        """``floor(bits * multiplier)`` of float32 magnitudes, in float64 as the C kernel computes it."""
        return torch.floor(magnitude.view(torch.int32).to(torch.float64) * self.multiplier).to(torch.int64)

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """The bucket of each value of ``x``, monotone in the value, as the C kernel gives it."""
        magnitude = x.to(torch.float32).abs()
        key = (self.key(magnitude) - self.first).clamp_(0, self.last - self.first)
        index = torch.where(x > 0, self.side + 1 + key, self.side - 1 - key)
        return torch.where(magnitude >= self.low32, index, torch.full_like(index, self.side))  # NaN: the zero bucket

    def edges(self, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The magnitudes ``[lo, hi)`` of bucket keys ``key`` (absolute, ``first`` <= key <= ``last``): the
        smallest float32 of each key and of the next, found from ``ceil(key / multiplier)`` and
        corrected by the product itself."""
        bounds = []
        for k in (key, key + 1):
            bits = torch.ceil(k.to(torch.float64) / self.multiplier)
            bits = bits + (torch.floor(bits * self.multiplier) < k).to(torch.float64)
            bits = bits - (torch.floor((bits - 1) * self.multiplier) >= k).to(torch.float64)
            bounds.append(bits.clamp(max=0x7F800000).to(torch.int32).view(torch.float32).to(torch.float64))
        return bounds[0], bounds[1]

    def value(self, index: torch.Tensor) -> torch.Tensor:
        """The representative value of each bucket index (0 for the zero bucket): ``2 lo hi / (lo + hi)``."""
        offset = index - self.side
        lo, hi = self.edges(offset.abs() - 1 + self.first)
        magnitude = 2 * lo * hi / (lo + hi)
        return torch.where(offset == 0, torch.zeros_like(magnitude), torch.sign(offset) * magnitude)


class UnitStats:
    """The running statistics of ``units`` units; ``update(x, samples)`` with ``x`` as ``[batch, units, positions]``."""

    def __init__(self, units: int, k: int, threshold: float, grid: SketchGrid, second_moment: bool,
                 position_shape: list[int]) -> None:
        self.units, self.k, self.threshold, self.grid = units, k, threshold, grid
        self.position_shape = list(position_shape)
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

    @staticmethod
    def held_bytes(units: int, k: int, grid_size: int, second_moment: bool) -> int:
        """The bytes of the tensors a ``UnitStats`` holds once ``k`` samples were seen: mean, M2, min,
        max (float64), above and the sketch (int64), top and bottom ``k`` values, samples and
        positions, and the ``units x units`` second moment (float64)."""
        return 8 * units * (4 + 1 + grid_size + 6 * k + (units if second_moment else 0))

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
        samples = samples.to(torch.int64).cpu()
        kept_last = max([int(t.max()) for t in (self.top_sample, self.bottom_sample) if t.numel()], default=-1)
        in_order = bool((samples[1:] > samples[:-1]).all()) and int(samples[0]) > kept_last
        samples = samples.view(-1, 1).expand(-1, self.units)
        top_value, top_position, bottom_value, bottom_position = per_sample
        self.top_value, self.top_sample, self.top_position = best(
            self.k, True, (self.top_value, self.top_sample, self.top_position), (top_value, samples, top_position),
            in_order)
        self.bottom_value, self.bottom_sample, self.bottom_position = best(
            self.k, False, (self.bottom_value, self.bottom_sample, self.bottom_position),
            (bottom_value, samples, bottom_position), in_order)
        if self.second is not None:
            flat = x.to(torch.float64).transpose(1, 2).reshape(-1, self.units)
            self.second = self.second + flat.T @ flat

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
        buckets = self.grid.index(flat) + torch.arange(self.units) * self.grid.size
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


def chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """``(n, mean, M2)`` of two parts together (Chan, Golub and LeVeque 1979); works on tensors and arrays."""
    n = n_a + n_b  # both parts hold at least one value
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    return n, mean, m2


def best(k: int, largest: bool, kept: tuple, new: tuple, in_order: bool = False) -> tuple:
    """The ``k`` best of ``kept`` and ``new`` (each ``(values, samples, positions)`` as ``[rows, units]``):
    by value, ties by the lower sample id. ``in_order``: ``kept`` is this function's own answer (in
    that order) and ``new``'s sample ids increase down the rows, all above ``kept``'s (a pass in
    order): the rows are then already in sample order among ties, and one stable sort by value does."""
    values, samples, positions = (torch.cat([a, b]) for a, b in zip(kept, new))
    if not in_order:
        by_sample = torch.sort(samples, dim=0, stable=True).indices
        values, samples, positions = (t.gather(0, by_sample) for t in (values, samples, positions))
    order = torch.sort(values, dim=0, descending=largest, stable=True).indices[:k]
    return tuple(t.gather(0, order) for t in (values, samples, positions))
