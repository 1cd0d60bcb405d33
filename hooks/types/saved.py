"""``saved_tensors``: ``torch.autograd.graph.saved_tensors_hooks`` scoped to the selected modules.

What autograd saves for backward while a selected module runs is packed by ``mode``:

* ``offload_cpu``: copied to CPU (into pinned memory, non-blocking, when it lives on CUDA) and
  copied back when backward needs it; on CPU it stays where it is.
* ``offload_disk``: written to a temporary file; the file is deleted when autograd frees the
  saved tensor, never on unpack, so unpacking twice (``retain_graph``) is safe.
* ``compress``: floating tensors stored as ``dtype`` (float16 or bfloat16); lossy.
* ``custom``: the researcher's own ``pack`` and ``unpack`` functions (import paths, resolved
  while the config is checked), called exactly as ``saved_tensors_hooks(pack, unpack)`` would;
  never on meta tensors (``plan=true`` and the rehearsal keep what they save as it is).

``min_bytes`` (offload modes): a tensor smaller than that many bytes (numel × itemsize) stays
where it is, as the tutorial's "only offload large tensors" does. unpack(pack(x)) == x holds
exactly for the two offload modes. Each packed tensor is recorded (kind ``saved``, phase
``forward``), as packed (what ``pack`` returned, when that is a tensor): bytes per layer =
sum of numel × itemsize.

The context is entered by a forward pre-hook and left by an ``always_call`` forward hook; the
session closes any context still open (Ctrl-C in forward skips ``always_call`` hooks), so the
global saved-tensor hook stack is left as it was found.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
import weakref
from typing import Any

import torch
from torch import nn

from hooks.mechanism.base import HookType
from hooks.mechanism.registry import register
from hooks.specs.saved import SavedSpec

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class _OnDisk:
    """A saved tensor's file; removed when autograd drops this handle."""

    def __init__(self, path: str, device: torch.device) -> None:
        self.path, self.device = path, device
        weakref.finalize(self, _remove, path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


@register("saved_tensors")
class SavedTensors(HookType):
    """Packs what autograd saves inside the selected modules; records every packed tensor."""

    spec_class = SavedSpec

    def __init__(self, name: str, spec: SavedSpec) -> None:
        super().__init__(name, spec)
        self._open: list[Any] = []  # contexts entered by pre-hooks and not yet left
        self._dir: str | None = None
        if spec.mode == "custom":
            self._user_pack, self._user_unpack = spec.functions(self.key)

    needs_backward = True

    expected_kinds = frozenset({"saved"})

    pytorch_hooks = ("saved_tensors_hooks, entered by register_forward_pre_hook, "
                     "left by register_forward_hook(always_call)")

    def attach(self, model: nn.Module, session) -> None:
        self._recorder = session.recorder
        if self.spec.mode == "offload_disk":
            self._dir = tempfile.mkdtemp(prefix="saved-tensors-", dir=self.spec.directory)
        pack, unpack = getattr(self, f"_pack_{self.spec.mode}"), getattr(self, f"_unpack_{self.spec.mode}")
        if self.spec.min_bytes:
            pack, unpack = _above(self.spec.min_bytes, pack, unpack)
        for layer, module in self.targets(model):
            def enter(module, args, layer=layer):
                call = self._recorder.next_call((self.name, layer))
                ctx = torch.autograd.graph.saved_tensors_hooks(self._recording(pack, layer, call), unpack)
                ctx.__enter__()
                self._open.append(ctx)

            def leave(module, args, output):
                if self._open:
                    self._open.pop().__exit__(None, None, None)

            session.add(module.register_forward_pre_hook(enter))
            session.add(module.register_forward_hook(leave, always_call=True))

    def close(self) -> None:
        while self._open:
            self._open.pop().__exit__(None, None, None)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _recording(self, pack, layer: str, call: int):
        slots = itertools.count()

        def on_pack(x: torch.Tensor):
            packed = pack(x)
            stored = packed if isinstance(packed, torch.Tensor) else packed[1] if isinstance(packed, _Packed) else x
            self._recorder.record(stored, hook=self.name, layer=layer, phase="forward", kind="saved",
                                  slot=str(next(slots)), call=call)
            return packed

        return on_pack

    @staticmethod
    def _pack_offload_cpu(x: torch.Tensor):
        if x.device.type in ("cpu", "meta"):  # already on the host; meta (plan=true) holds no data
            return _Packed(x.device, x)
        if x.device.type != "cuda":
            return _Packed(x.device, x.to("cpu"))
        host = torch.empty(x.shape, dtype=x.dtype, layout=x.layout, pin_memory=True)
        host.copy_(x, non_blocking=True)
        return _Packed(x.device, host)

    @staticmethod
    def _unpack_offload_cpu(packed) -> torch.Tensor:
        device, host = packed
        return host.to(device, non_blocking=True)

    def _pack_offload_disk(self, x: torch.Tensor):
        path = os.path.join(self._dir, f"{uuid.uuid4().hex}.pt")
        torch.save(x.detach().cpu(), path)
        return _OnDisk(path, x.device)

    @staticmethod
    def _unpack_offload_disk(handle: _OnDisk) -> torch.Tensor:
        return torch.load(handle.path, weights_only=True).to(handle.device)

    def _pack_compress(self, x: torch.Tensor):
        if not x.is_floating_point() or x.element_size() <= 2:
            return _Packed(x.dtype, x)
        return _Packed(x.dtype, x.to(DTYPES[self.spec.dtype]))

    @staticmethod
    def _unpack_compress(packed) -> torch.Tensor:
        dtype, x = packed
        return x.to(dtype)

    def _pack_custom(self, x: torch.Tensor):
        if x.device.type == "meta":  # the user's pack runs in the real run only
            return _Packed(None, x)
        return self._user_pack(x)

    def _unpack_custom(self, packed) -> torch.Tensor:
        if isinstance(packed, _Packed):
            return packed[1]
        return self._user_unpack(packed)


class _Packed(tuple):
    """What a built-in mode packs: ``(how to restore, the tensor kept)``, told apart from a user's tuple."""

    def __new__(cls, restore: Any, tensor: torch.Tensor):
        return super().__new__(cls, (restore, tensor))


def _above(min_bytes: int, pack, unpack):
    """``pack``/``unpack`` applied only to tensors of at least ``min_bytes``; smaller ones stay as they are."""
    def pack_large(x: torch.Tensor):
        return pack(x) if x.numel() * x.element_size() >= min_bytes else _Packed(None, x)

    def unpack_large(packed):
        return packed[1] if isinstance(packed, _Packed) and packed[0] is None else unpack(packed)

    return pack_large, unpack_large
