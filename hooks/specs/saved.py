"""``saved_tensors`` (``hooks.types.saved``): how the tensors autograd saves are packed."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES, HookSpec
from hooks.specs.callables import resolve_callable

MODES = ("offload_cpu", "offload_disk", "compress", "custom")
OFFLOAD_MODES = ("offload_cpu", "offload_disk")
#: ``compress``'s dtypes, by the names ``hooks.types.saved.DTYPES`` maps to torch's
DTYPES = ("float16", "bfloat16")


@dataclass
class SavedSpec(HookSpec):
    layers: Any = "**"
    mode: str = "offload_cpu"  #: how saved tensors are packed: ``offload_cpu``, ``offload_disk``, ``compress`` or ``custom``
    dtype: str = "float16"  #: with ``compress``: ``float16`` or ``bfloat16``
    directory: Optional[str] = None  #: with ``offload_disk``: where the files go (null: the system's temporary directory)
    min_bytes: int = 0  #: offload modes: tensors smaller than this stay where they are (0: every tensor)
    pack: Optional[str] = None  #: with ``custom``: the import path of your pack function
    unpack: Optional[str] = None  #: with ``custom``: the import path of your unpack function

    def check(self, key: str) -> None:
        if self.mode not in MODES:
            raise choice_error(f"{key}.mode", self.mode, MODES, "mode")
        if self.dtype not in DTYPES:
            raise choice_error(f"{key}.dtype", self.dtype, DTYPES, "dtype")
        if self.min_bytes < 0:
            raise ConfigError(f"{key}.min_bytes: {self.min_bytes} must be >= 0 (0: offload every tensor)")
        if self.min_bytes and self.mode not in OFFLOAD_MODES:
            raise ConfigError(f"{key}.min_bytes: only for mode={' or '.join(OFFLOAD_MODES)} (got mode={self.mode})")
        if self.mode == "offload_disk" and self.directory is not None and not (os.path.isdir(self.directory) and os.access(self.directory, os.W_OK)):
            raise ConfigError(f"{key}.directory: '{self.directory}' is not a writable directory; create it first, "
                              f"or use null for the system's temporary directory")
        if self.mode == "custom":
            self.functions(key)
        elif self.pack is not None or self.unpack is not None:
            raise ConfigError(f"{key}.{'pack' if self.pack is not None else 'unpack'}: only for mode=custom "
                              f"(got mode={self.mode})")

    def functions(self, key: str) -> tuple:
        """``pack`` and ``unpack`` imported and checked to take one argument each."""
        for name in ("pack", "unpack"):
            if getattr(self, name) is None:
                raise ConfigError(f"{key}.{name}: required for mode=custom, e.g. {key}.{name}=mypkg.hooks.my_{name}")
        return (resolve_callable(self.pack, f"{key}.pack", 1, "pack(tensor)"),
                resolve_callable(self.unpack, f"{key}.unpack", 1, "unpack(packed)"))


HOOK_TYPES.declare("saved_tensors", "hooks.types.saved", SavedSpec)
