"""``post_accumulate`` (``hooks.types.params``): a hook on each parameter's accumulated ``.grad``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES, HookSpec

OPS = ("record", "sgd")


@dataclass
class PostAccumulateSpec(HookSpec):
    layers: Any = "**"
    params: Optional[list[str]] = None  #: only these parameter names (null: all of the module's own)
    op: str = "record"  #: ``record`` the accumulated ``.grad``, or ``sgd``: also ``p -= lr * p.grad`` and free ``.grad``
    lr: float = 0.01  #: the learning rate of ``op: sgd``

    def check(self, key: str) -> None:
        if self.op not in OPS:
            raise choice_error(f"{key}.op", self.op, OPS, "op")
        if self.params is not None and not self.params:
            raise ConfigError(f"{key}.params: empty list; use null for every parameter or name some, e.g. [bias]")
        if not math.isfinite(self.lr) or self.lr < 0:
            raise ConfigError(f"{key}.lr: {self.lr} must be a finite number >= 0")


HOOK_TYPES.declare("post_accumulate", "hooks.types.params", PostAccumulateSpec)
