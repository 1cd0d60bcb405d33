"""``clamp``, ``scale`` and ``replace`` (``hooks.types.gradients``): where the gradient is taken, and each transform's keys."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import SlotEditSpec

TARGETS = ("params", "output", "input")


@dataclass
class GradSpec(SlotEditSpec):
    layers: Any = "**"
    target: str = "params"  #: where the gradient is taken: ``params``, ``output`` or ``input``
    params: Optional[list[str]] = None  #: with ``target: params``: only these parameter names, e.g. ``[bias]`` (null: all)
    record: bool = True  #: false (``target: params`` only): record nothing, only the edit

    def check(self, key: str) -> None:
        super().check(key)
        if self.target not in TARGETS:
            raise choice_error(f"{key}.target", self.target, TARGETS, "target")
        if self.params is not None and self.target != "params":
            raise ConfigError(f"{key}.params: only meaningful with target=params (got target={self.target})")
        if self.slot is not None and self.target == "params":
            raise ConfigError(f"{key}.slot: only meaningful with target=output or input; "
                              f"name parameters with {key}.params, e.g. [bias]")
        if self.params is not None and not self.params:
            raise ConfigError(f"{key}.params: empty list; use null for every parameter or name some, e.g. [bias]")
        if not self.record and self.target != "params":
            raise ConfigError(f"{key}.record: false is for target=params; a gradient edit on activations "
                              f"(target={self.target}) records what it changed")
        if self.target == "params" and self.scope == "global":
            raise ConfigError(f"{key}.scope: global applies to module calls; target=params hooks parameters "
                              f"directly, so use scope=module")


@dataclass
class ClampSpec(GradSpec):
    min: Optional[float] = None  #: lower bound (null: none)
    max: Optional[float] = None  #: upper bound (null: none)

    def check(self, key: str) -> None:
        super().check(key)
        if self.min is None and self.max is None:
            raise ConfigError(f"{key}: set min, max or both (e.g. {key}.min=-0.01 {key}.max=0.01)")
        for bound in ("min", "max"):
            value = getattr(self, bound)
            if value is not None and math.isnan(value):
                raise ConfigError(f"{key}.{bound}: NaN is not a bound")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"{key}: min ({self.min}) > max ({self.max}); swap them")


@dataclass
class ScaleSpec(GradSpec):
    factor: float = 2.0  #: what the gradient is multiplied by


@dataclass
class ReplaceSpec(GradSpec):
    value: float = 0.0  #: what every gradient element becomes


HOOK_TYPES.declare("clamp", "hooks.types.gradients", ClampSpec)
HOOK_TYPES.declare("scale", "hooks.types.gradients", ScaleSpec)
HOOK_TYPES.declare("replace", "hooks.types.gradients", ReplaceSpec)
