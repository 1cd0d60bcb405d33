"""``dla`` (``hooks.types.dla``): the logit difference attributed, and the position read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES
from hooks.specs.samples import SampleOutputsSpec


@dataclass
class DlaSpec(SampleOutputsSpec):
    diff: list[int] = field(default_factory=list)  #: ``[a, b]``: the logit difference ``logit[a] - logit[b]``, as ``metric.diff``
    position: Optional[int] = -1  #: the position read (-1: the last, as ``metric.diff`` reads it); null: every position

    def check(self, key: str) -> None:
        if len(self.diff) != 2 or min(self.diff) < 0:
            raise ConfigError(f"{key}.diff: {list(self.diff)} must be two token ids [a, b]: the logit difference "
                              f"logit[a] - logit[b], e.g. '{key}.diff=[3,7]'")


HOOK_TYPES.declare("dla", "hooks.types.dla", DlaSpec)
