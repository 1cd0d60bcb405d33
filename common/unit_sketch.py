"""The format of ``units.parquet``'s mergeable columns, numpy only: the quantile sketch's bucket grid,
Chan's merge of ``(count, mean, M2)`` and the order of the top-k / bottom-k samples.

The ``units`` hook type writes with these rules (``hooks.kernels.unit_stats``) and the readers merge and read
with the same ones (``runner.analysis.units``), so a table is read as it was written; reading one
imports no PyTorch. Imports nothing of ``hooks`` or ``runner``.

The quantile sketch is DDSketch (Masson et al., VLDB 2019) with its linearly interpolated mapping
(``SketchGrid``): each bucket spans magnitudes whose ratio is at most ``gamma = (1 + a) / (1 - a)``,
so its representative is within relative error ``a`` of every value in it. Counts add, so
sketches of shards merge exactly. Magnitudes below ``low`` share one zero bucket (estimated as 0:
absolute error < ``low``) and magnitudes above ``high`` the last bucket.

Top-k order (``ranked``): by value, descending for top and ascending for bottom, NaN counted the
largest (first among the top, last among the bottom, as ``torch.sort`` places it), ties by the lower
sample id; so the sets are the same whatever the batching or the sharding.
"""
from __future__ import annotations

import numpy as np


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
        self.first, self.last = (int(self.key(np.array([v], dtype=np.float32))[0]) for v in (self.low32, high))
        self.side = self.last - self.first + 1
        self.size = 2 * self.side + 1

    def key(self, magnitude: np.ndarray) -> np.ndarray:
        """``floor(bits * multiplier)`` of float32 magnitudes, in float64 as the C kernel computes it."""
        bits = np.ascontiguousarray(magnitude, dtype=np.float32).view(np.int32)
        return np.floor(bits.astype(np.float64) * self.multiplier).astype(np.int64)

    def index(self, x: np.ndarray) -> np.ndarray:
        """The bucket of each value of ``x``, monotone in the value, as the C kernel gives it."""
        x = np.asarray(x)
        with np.errstate(invalid="ignore", over="ignore"):  # float64 beyond float32's range: the last bucket
            magnitude = np.abs(x.astype(np.float32))
            key = np.clip(self.key(magnitude) - self.first, 0, self.last - self.first)
            index = np.where(x > 0, self.side + 1 + key, self.side - 1 - key)
            return np.where(magnitude >= self.low32, index, self.side)  # NaN: the zero bucket

    def edges(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The magnitudes ``[lo, hi)`` of bucket keys ``key`` (absolute, ``first`` <= key <= ``last``): the
        smallest float32 of each key and of the next, found from ``ceil(key / multiplier)`` and
        corrected by the product itself."""
        bounds = []
        for k in (np.asarray(key, dtype=np.int64), np.asarray(key, dtype=np.int64) + 1):
            bits = np.ceil(k.astype(np.float64) / self.multiplier)
            bits = bits + (np.floor(bits * self.multiplier) < k)
            bits = bits - (np.floor((bits - 1) * self.multiplier) >= k)
            bounds.append(np.minimum(bits, 0x7F800000).astype(np.int32).view(np.float32).astype(np.float64))
        return bounds[0], bounds[1]

    def value(self, index: np.ndarray) -> np.ndarray:
        """The representative value of each bucket index (0 for the zero bucket): ``2 lo hi / (lo + hi)``."""
        offset = np.asarray(index, dtype=np.int64) - self.side
        lo, hi = self.edges(np.abs(offset) - 1 + self.first)
        with np.errstate(invalid="ignore", divide="ignore"):
            magnitude = 2 * lo * hi / (lo + hi)
        return np.where(offset == 0, 0.0, np.sign(offset) * magnitude)


def chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """``(n, mean, M2)`` of two parts together (Chan, Golub and LeVeque 1979); works on tensors and arrays."""
    n = n_a + n_b  # both parts hold at least one value
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    return n, mean, m2


def ranked(values: np.ndarray, samples: np.ndarray, largest: bool, groups: np.ndarray | None = None) -> np.ndarray:
    """The indices that put ``values`` (``[rows]`` or ``[rows, units]``, ranked down the rows) in the
    top-k order (the module docstring): by value, NaN the largest, ties by the lower sample id;
    ``groups`` (1-D, one id per row): each group's rows together, in group order, ranked within."""
    values = np.asarray(values, dtype=np.float64)
    nan = np.isnan(values)
    by_value = np.where(nan, 0.0, -values if largest else values)
    keys = (np.broadcast_to(samples, values.shape), by_value, ~nan if largest else nan)
    return np.lexsort(keys + (() if groups is None else (groups,)), axis=0)
