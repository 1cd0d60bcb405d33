"""``saved_tensors``: ``torch.autograd.graph.saved_tensors_hooks`` scoped to the selected modules.

What autograd saves for backward while a selected module runs is packed by ``mode``:

* ``offload_cpu``: copied to CPU (into pinned memory, non-blocking, when it lives on CUDA) and
  copied back when backward needs it; on CPU it stays where it is.
* ``offload_disk``: written to a temporary file; the file is deleted when autograd frees the
  saved tensor, never on unpack, so unpacking twice (``retain_graph``) is safe.
* ``compress``: floating tensors stored as ``dtype`` (float16 or bfloat16); lossy.

unpack(pack(x)) == x holds exactly for the two offload modes. Each packed tensor is recorded
(kind ``saved``, phase ``forward``), as packed: bytes per layer = sum of numel × itemsize.

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
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from hooks.base import HookSpec, HookType
from hooks.errors import choice_error
from hooks.registry import register

MODES = ("offload_cpu", "offload_disk", "compress")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class SavedSpec(HookSpec):
    layers: Any = "**"
    mode: str = "offload_cpu"
    dtype: str = "float16"
    directory: Optional[str] = None

    def check(self, key: str) -> None:
        if self.mode not in MODES:
            raise choice_error(f"{key}.mode", self.mode, MODES, "mode")
        if self.dtype not in DTYPES:
            raise choice_error(f"{key}.dtype", self.dtype, DTYPES, "dtype")


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

    @property
    def needs_backward(self) -> bool:
        return True

    @property
    def pytorch_hooks(self) -> str:
        return "saved_tensors_hooks, entered by register_forward_pre_hook, left by register_forward_hook(always_call)"

    def attach(self, model: nn.Module, session) -> None:
        self._recorder = session.recorder
        if self.spec.mode == "offload_disk":
            self._dir = tempfile.mkdtemp(prefix="saved-tensors-", dir=self.spec.directory)
        pack, unpack = getattr(self, f"_pack_{self.spec.mode}"), getattr(self, f"_unpack_{self.spec.mode}")
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
            stored = packed[1] if isinstance(packed, tuple) else x
            self._recorder.record(stored, hook=self.name, layer=layer, phase="forward", kind="saved",
                                  slot=str(next(slots)), call=call)
            return packed

        return on_pack

    @staticmethod
    def _pack_offload_cpu(x: torch.Tensor):
        if x.device.type in ("cpu", "meta"):  # already on the host; meta (plan=true) holds no data
            return x.device, x
        if x.device.type != "cuda":
            return x.device, x.to("cpu")
        host = torch.empty(x.shape, dtype=x.dtype, layout=x.layout, pin_memory=True)
        host.copy_(x, non_blocking=True)
        return x.device, host

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
            return x.dtype, x
        return x.dtype, x.to(DTYPES[self.spec.dtype])

    @staticmethod
    def _unpack_compress(packed) -> torch.Tensor:
        dtype, x = packed
        return x.to(dtype)
