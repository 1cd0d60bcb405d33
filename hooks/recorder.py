"""The capture buffer that every hook type writes into during a step.

Hook callbacks only append here (a few list appends and the device-side reductions of
``hooks.stats``, done once per distinct tensor value); turning a step's captures into columns happens once, in ``drain``. The
recorder knows nothing of parquet: the run loop hands what ``drain`` returns to the writer.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hooks.stats import RAW, reduce_tensor, summarize

#: Columns that identify one captured tensor, in output order (``step`` is added by the writer).
ID_COLUMNS = ("call", "hook", "layer", "phase", "kind", "slot", "shape", "dtype", "numel")
#: Kinds whose first dimension is the batch and second the channels (``sample.batch`` and
#: ``sample.channels`` narrow them; parameter gradients have neither).
BATCH_KINDS = frozenset({"input", "output", "grad_input", "grad_output"})


def sampled_channels(width: int, n: int, seed: int) -> torch.Tensor:
    """The ``n`` channel indices (sorted) that ``sample.channels=n`` keeps of ``width`` channels.

    They depend only on ``(width, n, seed)``: the same channels at every step, in every layer of
    that width, and in every run with that seed.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + width)
    return torch.randperm(width, generator=gen)[:n].sort().values


def walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(slot, tensor)`` for every tensor inside a module's inputs or outputs.

    Tuples and lists give their positions (``"0"``, ``"1"``), mappings their keys, nested
    containers dotted paths (``"0.hidden"``); a bare tensor is slot ``"0"``. Non-tensors are skipped.
    """
    if isinstance(obj, torch.Tensor):
        yield (prefix or "0"), obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from walk(item, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__")):
        for key in obj.keys():
            yield from walk(obj[key], f"{prefix}.{key}" if prefix else str(key))


@dataclass
class StepCaptures:
    """One step's captures as columns: identifiers, statistics and the kept tensors."""

    columns: dict[str, list] = field(default_factory=dict)
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    kept_rows: list[int] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.columns.get("hook", ()))


class HostCopies:
    """Host copies of kept tensors that do not stall the device.

    A CPU tensor is cloned (it may be changed in place after the hook returns). A CUDA tensor is
    copied with ``non_blocking=True`` into pinned host memory: the hook returns at once and the
    copy overlaps the rest of the step; ``wait``, called once per step by ``Recorder.drain``,
    synchronises each device that has copies in flight before anyone reads them.
    """

    def __init__(self) -> None:
        self.in_flight: set[torch.device] = set()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if not tensor.is_cuda:
            return tensor.to("cpu", copy=True)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        self.in_flight.add(tensor.device)
        return host

    def wait(self) -> None:
        """Block until every copy made since the last ``wait`` has landed."""
        for device in self.in_flight:
            torch.cuda.current_stream(device).synchronize()
        self.in_flight.clear()


class Recorder:
    """Per-step buffer of captures, with the per-module call counters that fill ``call``.

    ``enabled = False`` makes ``record`` a no-op (steps left out by ``sample.every``; hooks that
    change tensors still do); ``sample_batch`` keeps only the first n samples of activations and
    ``sample_channels`` a random subset of their channels (dim 1, see ``sampled_channels``).
    """

    def __init__(self, sample_batch: int | None = None, sample_channels: int | None = None,
                 seed: int = 0) -> None:
        self.enabled = True
        self.sample_batch = sample_batch
        self.sample_channels = sample_channels
        self.seed = seed
        self.host = HostCopies()
        self._channel_index: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._reset()

    def _reset(self) -> None:
        self._calls: dict[tuple, int] = {}
        self._columns: dict[str, list] = {c: [] for c in ID_COLUMNS}
        self._raw: list[torch.Tensor] = []
        self._reduced: dict[tuple, tuple[weakref.ref, torch.Tensor]] = {}
        self._kept_rows: list[int] = []
        self._kept: list[torch.Tensor] = []

    def next_call(self, key: tuple) -> int:
        """Return how many times ``key`` (e.g. ``(hook, layer)``) was seen before in this step."""
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        return n

    def record(self, tensor: torch.Tensor, *, hook: str, layer: str, phase: str, kind: str,
               slot: str, call: int, keep: bool = False) -> None:
        """Append statistics of ``tensor`` and, when ``keep``, a detached copy of its values.

        The copy is made now because the tensor may be modified in place after the hook returns
        (``ReLU(inplace=True)``) and because a kept tensor must not hold the autograd graph.
        Shapes and dtypes are stored as they come and turned into column values in ``drain``.
        """
        if not self.enabled:
            return
        if kind in BATCH_KINDS:
            tensor = self._sample(tensor)
        cols = self._columns
        if keep:
            self._kept_rows.append(len(cols["hook"]))
            self._kept.append(self.host.copy(tensor))
        cols["call"].append(call)
        cols["hook"].append(hook)
        cols["layer"].append(layer)
        cols["phase"].append(phase)
        cols["kind"].append(kind)
        cols["slot"].append(slot)
        cols["shape"].append(tensor.shape)
        cols["dtype"].append(tensor.dtype)
        cols["numel"].append(tensor.numel())
        self._raw.append(self._reduce(tensor))

    def _reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``reduce_tensor``, once per distinct value: an alias seen again reuses the reduction.

        A module may return its input (``Identity``, ``Dropout`` in eval mode), and several hook
        entries may watch the same module. Same storage, layout, dtype and version counter (which
        every in-place op bumps) means the same values, provided the tensor first reduced is still
        alive (else its memory may have been reused): the cache holds it only by weak reference.
        """
        if tensor.is_inference():  # no version counter to tell an in-place change
            return reduce_tensor(tensor)
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device, tensor._version)
        seen = self._reduced.get(key)
        if seen is not None and seen[0]() is not None:
            return seen[1]
        raw = reduce_tensor(tensor)
        self._reduced[key] = (weakref.ref(tensor), raw)
        return raw

    def _sample(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.sample_batch is not None and tensor.dim() > 0:
            tensor = tensor[: self.sample_batch]
        n = self.sample_channels
        if n is not None and tensor.dim() > 1 and tensor.shape[1] > n:
            key = (tensor.shape[1], tensor.device)
            if key not in self._channel_index:
                self._channel_index[key] = sampled_channels(tensor.shape[1], n, self.seed).to(tensor.device)
            tensor = tensor.index_select(1, self._channel_index[key])
        return tensor

    def drain(self) -> StepCaptures:
        """Return this step's captures (one host transfer for all statistics) and start afresh."""
        raw = torch.stack(self._raw).cpu().numpy() if self._raw else np.empty((0, len(RAW)))
        self.host.wait()
        columns = self._columns
        columns["shape"] = [list(s) for s in columns["shape"]]
        columns["dtype"] = [str(d).removeprefix("torch.") for d in columns["dtype"]]
        out = StepCaptures(
            columns=columns,
            stats=summarize(raw, np.asarray(self._columns["numel"], dtype=np.int64)),
            kept_rows=self._kept_rows,
            kept=self._kept,
        )
        self._reset()
        return out
