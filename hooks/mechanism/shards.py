"""Sharded tensors (``DTensor``: FSDP2's parameters and gradients, tensor parallelism): what a hook
may read of them, and the statistics of the whole tensor from the shards.

Why: a ``DTensor`` is a wrapper without storage of its own; its ``data_ptr`` is not memory the
statistics kernel may read (FSDP2's first backward ended in SIGSEGV when it was handed one).
``local`` gives the rank's own shard, a plain tensor, and says how it sits in the whole;
``combine`` turns the shards' raw reductions (``hooks.kernels.stats.RAW``: shifted sums, counts, min,
max) into those of the whole tensor with one ``all_gather`` per process group per step, never
gathering the tensor itself. Every rank records the same whole-tensor row.

The kernel itself reads only plain tensors whose storage holds their elements
(``hooks.kernels.native.readable``).
"""
from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from common.errors import ConfigError
from hooks.kernels.stats import RAW

#: The module that defines ``DTensor``: until something imported it (FSDP2 does), no tensor is one,
#: and a run without it does not pay its import (seconds).
DTENSOR_MODULE = "torch.distributed.tensor"


class Shard(NamedTuple):
    """How a rank's local tensor sits in a ``DTensor``: the process groups it is split over and the whole shape."""

    groups: tuple  #: one process group per mesh dimension the tensor is split over
    shape: torch.Size  #: the whole tensor's shape
    numel: int  #: the local tensor's element count


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (FSDP2's parameters and gradients are)."""
    module = sys.modules.get(DTENSOR_MODULE)
    return module is not None and isinstance(t, module.DTensor)


def refuse_sharded(params: list[tuple[str, str, torch.Tensor]], key: str, what: str) -> None:
    """One line naming ``key`` when one of ``params`` (``(layer, name, parameter)``) is sharded and the
    entry would ``what``, which a rank's shard cannot do."""
    for layer, name, p in params:
        if is_sharded(p):
            raise ConfigError(f"{key}: '{layer}.{name}' is sharded (a DTensor: FSDP2's), and this entry would {what}; "
                              f"drop that setting or select unsharded parameters")


def local(t: torch.Tensor) -> tuple[torch.Tensor, Shard | None]:
    """``(the rank's local tensor, its Shard)``; a tensor that is not a ``DTensor`` comes back as is,
    with ``None``. A ``Partial`` placement (unreduced partial sums) is refused: its values are not
    the tensor's."""
    if not is_sharded(t):
        return t, None
    from torch.distributed.tensor import Partial, Replicate

    placements = t.placements
    if any(isinstance(p, Partial) for p in placements):
        raise ConfigError(f"a DTensor with pending partial sums ({placements}) holds no values of its own to record; "
                         f"record it after its reduction")
    groups = tuple(t.device_mesh.get_group(dim) for dim, p in enumerate(placements) if not isinstance(p, Replicate))
    mine = t.to_local()
    return mine, Shard(groups, t.shape, mine.numel())


def combine(raw: np.ndarray, shards: dict[int, Shard]) -> np.ndarray:
    """``raw`` (rows of ``RAW``, one per record) with each row in ``shards`` (row -> its Shard)
    replaced by the whole tensor's reductions.

    One ``all_gather`` per process group (one for FSDP2 on a 1-D mesh) of every sharded row's
    reductions and local element count. The ranks record the same sharded rows in the same
    order (the same parameters under the same entries), which is what makes the rows line up.
    """
    if not shards:
        return raw
    raw = raw.copy()
    counts = {row: float(shard.numel) for row, shard in shards.items()}
    by_group: dict = {}
    for row, shard in shards.items():
        for group in shard.groups:
            by_group.setdefault(group, []).append(row)
    for group, rows in by_group.items():
        mine = torch.tensor(np.column_stack([raw[rows], [counts[r] for r in rows]]), dtype=torch.float64)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)
        parts = torch.stack(gathered).numpy()  # (ranks, rows, RAW + count)
        for i, row in enumerate(rows):
            raw[row] = merge(parts[:, i, :-1], parts[:, i, -1])
            counts[row] = float(parts[:, i, -1].sum())
    return raw


def merge(parts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ``RAW`` reductions of a tensor from those of its pieces (rows of ``parts``, ``counts``
    elements each; empty pieces are skipped). The shifted sums are moved to the first piece's shift:
    sum(x - s) = d + n (t - s) and sum((x - s)^2) = q + 2 (t - s) d + n (t - s)^2 for a piece
    shifted by t with sums d and q."""
    index = {name: i for i, name in enumerate(RAW)}
    live = counts > 0
    if not live.any():
        return parts[0]
    parts, counts = parts[live], counts[live]
    dev, sq, shift = parts[:, index["shifted_sum"]], parts[:, index["shifted_sumsq"]], parts[:, index["shift"]]
    s = shift[0]
    moved = shift - s
    out = np.empty(len(RAW))
    out[index["shifted_sum"]] = np.sum(dev + counts * moved)
    out[index["shifted_sumsq"]] = np.sum(sq + 2 * moved * dev + counts * moved * moved)
    out[index["shift"]] = s
    for name in ("abs_sum", "zero_count", "nan_count", "inf_count"):
        out[index[name]] = parts[:, index[name]].sum()
    with np.errstate(invalid="ignore"):  # NaN propagates into min and max, as for a whole tensor
        out[index["min"]] = np.min(parts[:, index["min"]])
        out[index["max"]] = np.max(parts[:, index["max"]])
    return out
