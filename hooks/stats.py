"""Per-tensor statistics: a few reductions on the device now, the arithmetic on the host later.

``reduce_tensor`` returns a small float64 vector that stays on the tensor's device, so a step
with hundreds of captures costs one host transfer (``summarize`` on the stacked vectors), not
one per layer or per statistic. Sums accumulate in float64, so fp16/bf16 tensors cannot
overflow; integer and bool tensors are reduced as numbers. NaN propagates into ``mean``,
``min`` and ``max`` (a NaN is never hidden) and is counted in ``nan_count``.
"""
from __future__ import annotations

import numpy as np
import torch

#: Order of the raw reductions in the vector returned by ``reduce_tensor``.
RAW = ("sum", "sumsq", "abs_sum", "min", "max", "zero_count", "nan_count", "inf_count")
#: The statistic columns written to ``stats.parquet`` (float64 unless named ``*_count``).
STAT_COLUMNS = ("mean", "std", "min", "max", "abs_mean", "l2", "zero_frac", "nan_count", "inf_count")


def reduce_tensor(x: torch.Tensor) -> torch.Tensor:
    """Raw reductions of ``x`` (see ``RAW``) as a float64 vector on ``x``'s device."""
    x = x.detach()
    if x.is_complex():
        x = x.abs()
    if x.numel() == 0:
        nan = float("nan")
        return torch.tensor([0.0, 0.0, 0.0, nan, nan, 0.0, 0.0, 0.0], dtype=torch.float64, device=x.device)
    flat = x.reshape(-1)
    if not flat.is_floating_point():
        flat = flat.to(torch.float64)
    wide = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    lo, hi = torch.aminmax(flat)
    parts = (
        wide.sum(dtype=torch.float64),
        torch.dot(wide, wide).to(torch.float64),
        wide.abs().sum(dtype=torch.float64),
        lo.to(torch.float64),
        hi.to(torch.float64),
        (flat == 0).sum().to(torch.float64),
        torch.isnan(flat).sum().to(torch.float64),
        torch.isinf(flat).sum().to(torch.float64),
    )
    return torch.stack(parts)


def summarize(raw: np.ndarray, numel: np.ndarray) -> dict[str, np.ndarray]:
    """Turn stacked raw reductions (rows of ``RAW``) into the ``STAT_COLUMNS`` arrays.

    ``std`` is the sample standard deviation (``torch.std``'s default, correction=1), NaN for a
    single element as in PyTorch.
    """
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, len(RAW))
    n = np.asarray(numel, dtype=np.float64)
    total, sumsq, abs_sum, lo, hi, zeros, nans, infs = raw.T
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / n
        var = np.maximum(sumsq - total * mean, 0.0) / (n - 1)
        var = np.where(np.isfinite(sumsq), var, np.nan)
        return {
            "mean": mean,
            "std": np.where(n > 1, np.sqrt(var), np.nan),
            "min": lo,
            "max": hi,
            "abs_mean": abs_sum / n,
            "l2": np.sqrt(sumsq),
            "zero_frac": zeros / n,
            "nan_count": nans.astype(np.int64),
            "inf_count": infs.astype(np.int64),
        }
