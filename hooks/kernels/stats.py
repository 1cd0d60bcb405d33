"""Per-tensor statistics: a few reductions on the device now, the arithmetic on the host later.

``reduce_tensor`` returns a small float64 vector that stays on the tensor's device, so a step
with hundreds of captures costs one host transfer (``summarize`` on the stacked vectors), not
one per layer or per statistic. fp16/bf16 tensors are summed in float32, so they cannot
overflow; integer and bool tensors are reduced as numbers. NaN propagates into ``mean``,
``min`` and ``max`` (a NaN is never hidden) and is counted in ``nan_count``. Finite data never
report an infinite ``abs_mean`` or ``l2``: a float32 sum that overflows is taken again in float64.
Complex tensors are not reduced here: the recorder records their real and imaginary parts. A
sparse tensor is reduced as the dense tensor it stands for, from its stored values
(``hooks.kernels.tensor_kinds`` decides what every other kind of tensor is read as).
"""
from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import torch

from common.records import STAT_COLUMNS  # noqa: F401  (re-exported: the columns ``summarize`` returns)
from hooks.kernels import native
from hooks.kernels import tensor_kinds

#: Order of the raw reductions in the vector returned by ``reduce_tensor``.
RAW = ("shifted_sum", "shifted_sumsq", "abs_sum", "min", "max", "zero_count", "nan_count", "inf_count", "shift")


#: The dtypes reduced as they are; every other is widened first.
WIDE = (torch.float32, torch.float64)

#: Tensors with at least this many elements go through the compiled one-pass reduction; below
#: it, launching eight eager reductions is cheaper than a compiled call's guard checks.
COMPILE_MIN_NUMEL = 1 << 12

#: Below this magnitude float32 squares lose their digits to underflow: a float32 tensor (the C
#: kernel: a block) of smaller magnitudes only is summed in float64.
TINY = 2.0 ** -60

_compiled = None  # the compiled ``fused_reductions``, built on first use; False when unavailable


def reduce_tensor(x: torch.Tensor) -> torch.Tensor:
    """Raw reductions of ``x`` (see ``RAW``) as a float64 vector on ``x``'s device.

    Sums run in float32 (float64 for float64, int32 and int64 input, which float32 would round
    past 2**24): PyTorch's CPU sum is a cascade sum, accurate to ~1e-7 relative, and 50x faster
    than accumulating in float64. fp16/bf16/bool/int8/int16 inputs are widened to float32 first,
    so nothing overflows. Sums are taken around the first finite-or-zero element (``shift``), so
    the variance of a tensor whose mean dwarfs its spread does not cancel to noise. CPU tensors
    take one pass of the C kernel (``native.reduce_contiguous``); large CUDA tensors one compiled
    pass (``fused_reductions``); the eager passes (``eager_reductions``) take small CUDA tensors,
    tensor subclasses the kernel cannot read, CPU tensors where the kernel cannot be built or is
    switched off (``HOOK_RUNNER_NATIVE=0``; never ``torch.compile`` on CPU) and CUDA tensors where
    ``torch.compile`` is unavailable, as does a hook
    that ``torch.compile`` traces: torch ops go into the graph, where the kernel would break it.
    """
    x = tensor_kinds.ordinary(x, "the tensor to reduce")
    if x.is_nested:
        x = tensor_kinds.nested_elements(x)
    if x.is_complex():
        raise TypeError("reduce_tensor takes real tensors; record a complex tensor's .real and .imag")
    compiling = torch.compiler.is_compiling()  # traced: the kernel is not asked about (a graph break)
    return reduce_real(x, not compiling and native.kernel() is not None, compiling)


def reduce_real(x: torch.Tensor, kernel: bool, compiling: bool) -> torch.Tensor:
    """``reduce_tensor`` of a real tensor that is already what the recorder reads (``tensor_kinds.ordinary``,
    not nested), given what ``reduce_tensor`` would ask: whether the CPU kernel is on (``native.kernel()``)
    and whether ``torch.compile`` is tracing. The recorder asks the first once per step, not per tensor
    (reading the switch costs more Python than the rest of a small tensor's reduction)."""
    x = x.detach()
    if x.numel() == 0:
        nan = float("nan")
        return torch.tensor([0.0, 0.0, 0.0, nan, nan, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64, device=x.device)
    if x.layout in tensor_kinds.SPARSE_LAYOUTS:  # tensor_kinds.is_sparse, without a call per tensor
        return sparse_reductions(x)
    if not compiling and (type(x) is torch.Tensor or type(x) is torch.nn.Parameter) \
            and x.untyped_storage().nbytes() < (x.storage_offset() + x.numel()) * x.element_size():
        tensor_kinds.check_held(x)  # on every path: the eager reductions would read freed memory as the kernel would
    flat = x.reshape(-1)
    if flat.dtype not in WIDE:  # int32/int64 need float64 to stay exact past 2**24
        flat = flat.double() if not flat.is_floating_point() and flat.element_size() >= 4 else flat.float()
    if compiling:  # a hook traced by torch.compile: torch ops, in the graph, no graph break
        return eager_reductions(flat)
    if flat.device.type == "cpu":
        if kernel:
            flat = flat.contiguous()
            if native.readable(flat):
                return native.reduce_contiguous(flat)
    elif flat.numel() >= COMPILE_MIN_NUMEL:
        fused = compiled_reductions()
        if fused is not None:
            with torch.no_grad():
                return fused(flat)
    return eager_reductions(flat)


def sparse_reductions(x: torch.Tensor) -> torch.Tensor:
    """``RAW`` of the dense tensor a sparse ``x`` stands for, from its stored values: each implicit
    zero adds ``-shift`` to the shifted sum, ``shift**2`` to the shifted sum of squares, one zero,
    and 0 to the range; nothing is made dense."""
    values = tensor_kinds.stored_values(x)
    implicit = x.numel() - values.numel()
    if values.numel() == 0:
        return torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, implicit, 0.0, 0.0, 0.0], dtype=torch.float64, device=x.device)
    raw = reduce_tensor(values).clone()
    if implicit:
        shift = raw[8]
        zero = torch.zeros((), dtype=torch.float64, device=raw.device)
        raw[0] -= implicit * shift
        raw[1] += implicit * shift * shift
        raw[3] = torch.minimum(raw[3], zero)  # NaN stays NaN
        raw[4] = torch.maximum(raw[4], zero)
        raw[5] += implicit
    return raw


def prepare(device: torch.device) -> None:
    """Build (or load) the kernel that ``reduce_tensor`` will use on ``device``, before any step runs."""
    if device.type == "cpu":
        native.kernel()
    else:
        compiled_reductions()


def eager_reductions(flat: torch.Tensor) -> torch.Tensor:
    """``RAW`` of a flat float32/float64 tensor with eager kernels (one pass per reduction).

    Counts use ``count_nonzero``, the one fast boolean reduction: ``x - x`` is non-zero exactly at
    NaN and ±Inf, ``x != x`` exactly at NaN. Small tensors (below ``COMPILE_MIN_NUMEL``) and CUDA
    tensors are summed in float64 outright; a large float32 CPU tensor is summed in float32 (the
    fast path), and again in float64 only when a sum is not finite (a float32 sum of finite values
    may overflow, and meet an infinity of the other sign: NaN where float64 gives the infinity, as
    the C kernel does) or when every magnitude is below ``TINY``.
    A hook that ``torch.compile`` traces sums in float64 outright: that check reads a tensor's value
    in Python (a graph break per call), while the graph fuses the widening into the reduction.
    """
    lo, hi = torch.aminmax(flat)
    nonfinite = torch.count_nonzero(flat - flat)
    nans = torch.count_nonzero(flat != flat)
    shift = _shift(flat)
    narrow = (flat.dtype != torch.float64 and flat.numel() >= COMPILE_MIN_NUMEL and not flat.is_cuda
              and not torch.compiler.is_compiling())
    sums = _sums(flat, shift) if narrow else _sums(flat.double(), shift.double())
    if narrow and (not bool(torch.isfinite(torch.stack(sums)).all()) or float(torch.maximum(-lo, hi)) < TINY):
        sums = _sums(flat.double(), shift.double())
    parts = (
        *sums,
        lo,
        hi,
        flat.numel() - torch.count_nonzero(flat),
        nans,
        nonfinite - nans,
        shift,
    )
    return torch.stack([p.to(torch.float64) for p in parts])


def _sums(flat: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shifted sum, shifted sum of squares and sum of absolute values, in ``flat``'s dtype."""
    centered = flat - shift
    return centered.sum(), centered.square().sum(), flat.abs().sum()


def fused_reductions(flat: torch.Tensor) -> torch.Tensor:
    """``RAW`` of a flat float32/float64 tensor, written for ``torch.compile`` to fuse into one
    vectorised loop over memory (7-8 GB/s on one core of this project's machine, against well
    under 1 GB/s for the eager passes, measured on 0.8-13 MB tensors).

    The compiled sums are plain vector-lane accumulations, not PyTorch's cascade, so they widen
    to float64 in registers: as fast (the loop is bound by memory) and more accurate.
    """
    shift = _shift(flat)
    centered = flat.double() - shift.double()  # widened first: x - shift may overflow float32
    parts = (
        centered.sum(),
        (centered * centered).sum(),
        flat.abs().double().sum(),
        flat.amin(),
        flat.amax(),
        (flat == 0).sum(),
        (flat != flat).sum(),           # isnan/isinf compile to a scalar loop; compares vectorise
        (flat.abs() == math.inf).sum(),
        shift,
    )
    return torch.stack([p.to(torch.float64) for p in parts])


def compiled_reductions():
    """``fused_reductions`` compiled with ``dynamic=True`` (one graph per dtype for every size), or None.

    Compiled on the first large tensor, not at import: importing the compiler costs about a
    second of start-up and the first compile a few more (cached on disk for later runs). A
    machine without a working compiler falls back to the eager passes, with one warning.
    """
    global _compiled
    if _compiled is None:
        # A CUDA build on a machine without the CUDA runtime logs "No CUDA runtime is found" when the
        # compiler loads its C++ helpers: true, and irrelevant to a CPU kernel, and not the user's concern.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        try:
            # One CPU thread: the compiled kernel's OpenMP pool is not PyTorch's, and two pools
            # spinning on the same cores made a 32k-element reduction 200x slower (26 ms).
            fn = torch.compile(fused_reductions, dynamic=True, options={"cpp.threads": 1})
            fn(torch.zeros(COMPILE_MIN_NUMEL))  # compile now, so a failure shows here
            fn(torch.zeros(COMPILE_MIN_NUMEL, dtype=torch.float64))
            _compiled = fn
        except Exception as exc:  # no C++ compiler, unsupported platform, ...
            warnings.warn(f"torch.compile unavailable ({type(exc).__name__}: {exc}); "
                          f"statistics use eager reductions", RuntimeWarning, stacklevel=2)
            _compiled = False
    return _compiled or None


def _shift(flat: torch.Tensor) -> torch.Tensor:
    first = flat[0]
    return torch.where(torch.isfinite(first), first, torch.zeros_like(first))


def summarize(raw: np.ndarray, numel: np.ndarray) -> dict[str, np.ndarray]:
    """Turn stacked raw reductions (rows of ``RAW``) into the ``STAT_COLUMNS`` arrays.

    ``std`` is the sample standard deviation (``torch.std``'s default, correction=1), NaN for a
    single element as in PyTorch.
    """
    raw = np.asarray(raw, dtype=np.float64).reshape(-1, len(RAW))
    n = np.asarray(numel, dtype=np.float64)
    deviation, shifted_sumsq, abs_sum, lo, hi, zeros, nans, infs, shift = raw.T
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = deviation + n * shift
        mean = total / n
        var = np.maximum(shifted_sumsq - deviation * deviation / n, 0.0) / (n - 1)
        sumsq = np.maximum(shifted_sumsq + shift * (2 * total - n * shift), 0.0)
        return {
            "mean": mean,
            "std": np.where(n > 1, np.sqrt(var), np.nan),
            "min": lo,
            "max": hi,
            "abs_mean": abs_sum / n,
            "l2": np.where((infs > 0) & (nans == 0), np.inf, np.sqrt(sumsq)),
            "zero_frac": zeros / n,
            "nan_count": nans.astype(np.int64),
            "inf_count": infs.astype(np.int64),
        }
