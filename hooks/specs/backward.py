"""``full_backward``, ``backward_pre`` and ``node`` (``hooks.types.backward``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import EditSpec, TapSpec, check_kinds

MECHANISMS = ("tensor", "module")
NODE_KINDS = ("grad_output", "grad_input")


@dataclass
class BackwardSpec(EditSpec):
    mechanism: str = "tensor"  #: ``tensor`` (tensor hooks, the default) or ``module`` (PyTorch's full backward hooks)
    replace: Optional[float] = None  #: null: record only; a number: every ``grad_input`` (``full_backward``) or ``grad_output`` (``backward_pre``) becomes it

    def check(self, key: str) -> None:
        super().check(key)
        if self.mechanism not in MECHANISMS:
            raise choice_error(f"{key}.mechanism", self.mechanism, MECHANISMS, "mechanism")
        if self.replace is not None and math.isnan(self.replace):
            raise ConfigError(f"{key}.replace: NaN is not a gradient value")
        if self.index is not None and self.replace is None:
            raise ConfigError(f"{key}.index: narrows what replace overwrites, and replace is null; set "
                              f"{key}.replace or drop the index")


@dataclass
class NodeSpec(TapSpec):
    kinds: list[str] = field(default_factory=lambda: ["grad_output", "grad_input"])  #: ``grad_output`` (the Node's pre-hook), ``grad_input`` (its post-hook), or both

    def check(self, key: str) -> None:
        super().check(key)
        check_kinds(key, self.kinds)
        for kind in self.kinds:
            if kind not in NODE_KINDS:
                raise choice_error(f"{key}.kinds", kind, NODE_KINDS, "kind for a Node hook")


HOOK_TYPES.declare("full_backward", "hooks.types.backward", BackwardSpec)
HOOK_TYPES.declare("backward_pre", "hooks.types.backward", BackwardSpec)
HOOK_TYPES.declare("node", "hooks.types.backward", NodeSpec)
