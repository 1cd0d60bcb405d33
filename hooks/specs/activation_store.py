"""``store`` (``hooks.types.activation_store``): the store's directory, shard size and dtype."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.errors import ConfigError, choice_error
from common.store_format import DTYPES, MANIFEST, read_store_manifest
from hooks.specs.base import HOOK_TYPES
from hooks.specs.samples import SampleOutputsSpec


@dataclass
class StoreSpec(SampleOutputsSpec):
    """Keys of a ``store`` entry."""

    path: Optional[str] = None   #: required: the store's directory (one subdirectory per layer)
    shard_size: int = 1024       #: samples per shard: bounds the memory of the pass
    dtype: str = "float32"       #: float32, float16 or bfloat16

    def check(self, key: str) -> None:
        if not self.path:
            raise ConfigError(f"{key}.path: required, the directory of the store, e.g. {key}.path=stores/run1")
        if self.shard_size < 1:
            raise ConfigError(f"{key}.shard_size: {self.shard_size} must be at least 1")
        if self.dtype not in DTYPES:
            raise choice_error(f"{key}.dtype", self.dtype, DTYPES, "dtype")
        self.check_stored(key)

    def check_stored(self, key: str) -> None:
        """The stores already at ``path`` (a killed pass's, or a finished one) are of this layout, not the
        ``.npy`` one before: else one line, before the run (a store of another dtype or shard size is
        refused by its writer, which knows the layers)."""
        for found in sorted({*Path(self.path).glob(f"*/{MANIFEST}"), *Path(self.path).glob(f"*/rank-*/{MANIFEST}")}):
            try:
                read_store_manifest(found.parent)
            except ValueError as exc:
                raise ConfigError(f"{key}.path: {exc}") from None


HOOK_TYPES.declare("store", "hooks.types.activation_store", StoreSpec)
