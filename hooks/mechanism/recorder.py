"""The capture buffer that every hook type writes into during a step.

Hook callbacks only append here (a few list appends and the device-side reductions of
``hooks.kernels.stats``, done once per distinct tensor value); turning a step's captures into columns
happens once, in ``drain``. The recorder knows nothing of parquet: the run loop hands what
``drain`` returns to the writer. The schema of a row (columns, kinds, phases) is ``common.records``.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import torch

from common.records import BATCH_KINDS, ID_COLUMNS, StepCaptures
from common.slots import replace_slot, walk  # noqa: F401  (re-exported: hooks name slots through the recorder)
from hooks.kernels import native, tensor_kinds
from hooks.kernels.stats import RAW, reduce_real, summarize
from hooks.mechanism import shards


class Tally(NamedTuple):
    """What one entry recorded of one kind since the recorder was made (``drain`` keeps it)."""

    count: int       #: rows
    nbytes: int      #: bytes of the tensors recorded (numel x itemsize, after sampling)
    kept_bytes: int  #: bytes kept for ``tensors.parquet`` (float32 values)


def sampled_channels(width: int, n: int, seed: int) -> torch.Tensor:
    """The ``n`` channel indices (sorted) that ``sample.channels=n`` keeps of ``width`` channels.

    They depend only on ``(width, n, seed)``: the same channels at every step, in every layer of
    that width, and in every run with that seed.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + width)
    return torch.randperm(width, generator=gen)[:n].sort().values


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

    ``set_enabled(False)`` makes ``record`` a no-op (steps left out by ``sample.every``; hooks
    that change tensors still do); ``relabel(phase)`` gives every record made inside it that
    phase (eval passes); ``backward_pass()`` marks a running backward, so that a forward call
    made inside it (activation checkpointing's recompute) is recorded as phase ``recompute`` and
    numbered apart from the step's forward calls. ``sample_batch`` keeps only the first n samples
    of activations and ``sample_channels`` a random subset of their channels (dim 1, see
    ``sampled_channels``). ``statistics=False`` records identifiers and sizes only: no
    reduction, no copy (``plan=true`` and the meta-device rehearsal); ``drain`` then returns no
    statistic columns. ``tally()`` counts what each entry recorded, across steps.
    """

    def __init__(self, sample_batch: int | None = None, sample_channels: int | None = None,
                 seed: int = 0, statistics: bool = True) -> None:
        self.enabled = True
        self.sample_batch = sample_batch
        self.sample_channels = sample_channels
        self.seed = seed
        self.statistics = statistics
        self.host = HostCopies()
        #: the dataset index of each row of the batch being run (a whole-dataset pass sets it), else None
        self.samples: torch.Tensor | None = None
        #: a sample id's ``(name, class)`` as its user knows it (a whole-dataset pass of a kind that names
        #: its items sets it: ``runner.sources.batches.ItemRange.names``), else None: the id is its name
        self.sample_names: Callable[[int], tuple[str, str]] | None = None
        self._channel_index: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._relabel: str | None = None
        self._in_backward = False
        self._tally: dict[tuple[str, str, str], list[int]] = {}
        self._calls_total: dict[tuple, int] = {}  # the counts of finished steps
        self._calls: dict[tuple, int] = {}
        self._backward_calls: dict[tuple, int] = {}
        #: ``(hook, layer, phase, kind, slot)`` of the rows made from a ``DTensor``: each the whole
        #: tensor's, which every rank records alike (``common.ranks.SAME_ON_EVERY_RANK``)
        self.same_on_every_rank: set[tuple[str, str, str, str, str]] = set()
        self._reset()

    def _reset(self) -> None:
        self._calls_total = self.call_counts()
        self._calls = {}
        self._backward_calls = {}
        self._columns: dict[str, list] = {c: [] for c in ID_COLUMNS}
        self._raw: list[torch.Tensor] = []
        self._shards: dict[int, shards.Shard] = {}  # row -> how its tensor was a shard of a DTensor
        self._reduced: dict[tuple, tuple[weakref.ref, torch.Tensor]] = {}
        #: whether the CPU kernel is on (``native.kernel()``), asked at the step's first CPU reduction, not per tensor
        self._kernel: bool | None = None
        self._kept_rows: list[int] = []
        self._kept: list[torch.Tensor] = []

    # -- the run loop's controls ----------------------------------------------------------
    def set_enabled(self, on: bool) -> None:
        """Record (``True``) or drop (``False``) what hooks hand in from now on."""
        self.enabled = bool(on)

    @contextlib.contextmanager
    def relabel(self, phase: str) -> Iterator[None]:
        """Every record made inside the block gets ``phase`` (e.g. ``eval``), whatever its hook says."""
        before, self._relabel = self._relabel, phase
        try:
            yield
        finally:
            self._relabel = before

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Passes inside the block leave nothing: nothing recorded, and their module calls not
        counted, so call numbers and ``max_calls`` lifetimes are those of the run's own passes
        (a clean pass run beside each step for ``patch`` with ``source: clean``)."""
        saved = self.enabled, self._calls, self._backward_calls
        self.enabled, self._calls, self._backward_calls = False, {}, {}
        try:
            yield
        finally:
            self.enabled, self._calls, self._backward_calls = saved

    @contextlib.contextmanager
    def tallied_aside(self) -> Iterator[dict[tuple[str, ...], Tally]]:
        """``aside`` for a rehearsal's meta pass (``runner.attach``'s first call) that must say what a
        step records: the dict yielded is filled, when the block ends, with the block's ``tally()``
        (sampled as a step is); the recorder is left as it was."""
        saved = dict(vars(self))
        self.enabled, self.statistics, self._relabel, self._tally, self._calls_total = True, False, None, {}, {}
        self._channel_index = {}  # the meta pass's own (its indices are on the meta device)
        self._reset()
        found: dict[tuple[str, ...], Tally] = {}
        try:
            yield found
            found.update(self.tally())
        finally:
            vars(self).update(saved)

    @contextlib.contextmanager
    def backward_pass(self) -> Iterator[None]:
        """Mark the block as a backward pass (``HookSession.backward`` enters it around ``loss.backward()``).

        Forward records made inside are a recompute (``torch.utils.checkpoint``): phase
        ``recompute``, and ``next_call`` counts apart, so the n-th recompute of a module is
        ``call`` n like the n-th forward call it repeats (when recomputed in forward order).
        """
        before, self._in_backward = self._in_backward, True
        try:
            yield
        finally:
            self._in_backward = before

    # -- what hooks call --------------------------------------------------------------------
    def next_call(self, key: tuple) -> int:
        """Return how many times ``key`` (e.g. ``(hook, layer)``) was seen before in this step."""
        calls = self._backward_calls if self._in_backward else self._calls
        n = calls.get(key, 0)
        calls[key] = n + 1
        return n

    def record(self, tensor: torch.Tensor, *, hook: str, layer: str, phase: str, kind: str,
               slot: str, call: int, keep: bool = False) -> None:
        """Append statistics of ``tensor`` and, when ``keep``, a detached copy of its values.

        The copy is made now because the tensor may be modified in place after the hook returns
        (``ReLU(inplace=True)``) and because a kept tensor must not hold the autograd graph.
        Shapes and dtypes are stored as they come and turned into column values in ``drain``.
        A complex tensor gives two rows, its real and imaginary parts (slots ``SLOT.real``,
        ``SLOT.imag``), with the complex dtype. A ``DTensor`` (FSDP2's parameters and gradients) is
        reduced on this rank's shard and its row made the whole tensor's in ``drain``
        (``hooks.mechanism.shards``); kept, its whole values are gathered.
        """
        if not self.enabled:
            return
        if self._relabel is not None:
            phase = self._relabel
        elif self._in_backward and phase == "forward":
            phase = "recompute"
        subclass = type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter
        if subclass:  # first: no code of a user's tensor subclass runs from here
            tensor = tensor_kinds.plain(tensor)
        dtype = tensor.dtype  # a quantized tensor's, also when its dequantized values are read
        if tensor.is_meta or tensor.is_quantized:  # the rare kinds: the label is built only for them
            tensor = tensor_kinds.ordinary(tensor, f"'{layer or '(model)'}' {kind} {slot}", values=self.statistics)
        if kind in BATCH_KINDS and (self.sample_batch is not None or self.sample_channels is not None):
            tensor = self._sample(tensor)
        if tensor.is_nested:
            tensor = tensor_kinds.nested_elements(tensor)
        shard = None
        if subclass and shards.is_sharded(tensor):  # a DTensor: its whole values when kept, else the local shard
            tensor, shard = (tensor.full_tensor(), None) if keep else shards.local(tensor)
            parts = (f"{slot}.real", f"{slot}.imag") if tensor.is_complex() else (slot,)
            self.same_on_every_rank.update((hook, layer, phase, kind, part) for part in parts)
        if tensor.is_complex():
            for part, values in (("real", tensor.real), ("imag", tensor.imag)):
                self._append(values, dtype, hook, layer, phase, kind, f"{slot}.{part}", call, keep, shard)
        else:
            self._append(tensor, dtype, hook, layer, phase, kind, slot, call, keep, shard)

    def _append(self, tensor: torch.Tensor, dtype: torch.dtype, hook: str, layer: str, phase: str, kind: str,
                slot: str, call: int, keep: bool, shard: shards.Shard | None = None) -> None:
        cols = self._columns
        shape = tensor.shape if shard is None else shard.shape
        numel = shape.numel()
        tally = self._tally.get((hook, layer, kind))
        if tally is None:
            tally = self._tally[(hook, layer, kind)] = [0, 0, 0]
        tally[0] += 1
        tally[1] += numel * tensor.element_size()
        if keep:
            tally[2] += numel * 4  # kept values are stored as float32
            if self.statistics:
                self._kept_rows.append(len(cols["hook"]))
                self._kept.append(self.host.copy(tensor_kinds.dense(tensor)))
        cols["call"].append(call)
        cols["hook"].append(hook)
        cols["layer"].append(layer)
        cols["phase"].append(phase)
        cols["kind"].append(kind)
        cols["slot"].append(slot)
        cols["tensor_shape"].append(shape)
        cols["dtype"].append(dtype)
        cols["numel"].append(numel)
        if self.statistics:
            if shard is not None:
                self._shards[len(self._raw)] = shard
            self._raw.append(self._reduce(tensor))

    # -- what the session and the run loop read ---------------------------------------------
    def tally(self, by_layer: bool = False) -> dict[tuple[str, ...], Tally]:
        """Rows and bytes recorded per ``(hook, kind)`` (``(hook, layer, kind)`` with ``by_layer``)
        since the recorder was made; ``drain`` does not reset it."""
        out: dict[tuple[str, ...], list[int]] = {}
        for (hook, layer, kind), counts in self._tally.items():
            key = (hook, layer, kind) if by_layer else (hook, kind)
            total = out.setdefault(key, [0, 0, 0])
            for i, n in enumerate(counts):
                total[i] += n
        return {key: Tally(*counts) for key, counts in out.items()}

    def restore_call_counts(self, counts: dict[tuple, int]) -> None:
        """Start from the counts a resumed run had made (``call_counts()`` then), so that lifetimes
        by ``max_calls`` end where they would have."""
        self._calls_total = dict(counts)

    def call_counts(self) -> dict[tuple, int]:
        """How often each ``next_call`` key was counted since the recorder was made (this step included)."""
        out = dict(self._calls_total)
        for counts in (self._calls, self._backward_calls):
            for key, n in counts.items():
                out[key] = out.get(key, 0) + n
        return out

    def _reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``hooks.kernels.stats.reduce_tensor``, once per distinct value: an alias seen again reuses the reduction.

        A module may return its input (``Identity``, ``Dropout`` in eval mode), and several hook
        entries may watch the same module. Same storage, layout, dtype and version counter (which
        every in-place op bumps) means the same values, provided the tensor first reduced is still
        alive (else its memory may have been reused): the cache holds it only by weak reference.
        """
        if torch.compiler.is_compiling():  # traced into the graph: no pointers there, and no kernel to ask about
            return reduce_real(tensor, False, True)
        kernel = self._kernel
        if kernel is None and tensor.is_cpu:  # the switch is read, and the kernel built, only for CPU tensors
            kernel = self._kernel = native.kernel() is not None
        if tensor.is_inference() or tensor.layout in tensor_kinds.SPARSE_LAYOUTS:  # no version counter or data_ptr
            return reduce_real(tensor, bool(kernel), False)
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device, tensor._version)
        seen = self._reduced.get(key)
        if seen is not None and seen[0]() is not None:
            return seen[1]
        raw = reduce_real(tensor, bool(kernel), False)
        self._reduced[key] = (weakref.ref(tensor), raw)
        return raw

    def _sample(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_nested:  # a batch of components of their own shapes: the first n, no channels
            return tensor_kinds.nested_elements(tensor, self.sample_batch)
        sparse = tensor_kinds.is_sparse(tensor)
        if self.sample_batch is not None and tensor.dim() > 0:
            tensor = (tensor_kinds.sparse_select(tensor, torch.arange(min(self.sample_batch, tensor.shape[0])), 0)
                      if sparse else tensor[: self.sample_batch])
        n = self.sample_channels
        if n is not None and tensor.dim() > 1 and tensor.shape[1] > n:
            key = (tensor.shape[1], tensor.device)
            if key not in self._channel_index:
                self._channel_index[key] = sampled_channels(tensor.shape[1], n, self.seed).to(tensor.device)
            index = self._channel_index[key]
            tensor = tensor_kinds.sparse_select(tensor, index, 1) if sparse else tensor.index_select(1, index)
        return tensor

    def drain(self) -> StepCaptures:
        """Return this step's captures (one host transfer for all statistics) and start afresh."""
        self.host.wait()
        columns = self._columns
        stats = {}
        if self.statistics:
            raw = torch.stack(self._raw).cpu().numpy() if self._raw else np.empty((0, len(RAW)))
            raw = shards.combine(raw, self._shards)
            stats = summarize(raw, np.asarray(columns["numel"], dtype=np.int64))
        columns["tensor_shape"] = [list(s) for s in columns["tensor_shape"]]
        columns["dtype"] = [str(d).removeprefix("torch.") for d in columns["dtype"]]
        out = StepCaptures(columns=columns, stats=stats, kept_rows=self._kept_rows, kept=self._kept)
        self._reset()
        return out
