"""``shift`` and ``edit_output`` (``hooks.types.edits``): the op and its operand."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import EditSpec, SlotEditSpec

#: The ops ``hooks.types.edits.OPS`` applies: the new tensor is ``op(tensor, value)``.
OPS = ("add", "mul", "set")
OUTPUT_OPS = ("add_input", *OPS)


def _check_value(key: str, value: float) -> None:
    if math.isnan(value):
        raise ConfigError(f"{key}.value: NaN would poison every activation after this layer")


@dataclass
class ShiftSpec(EditSpec):
    layers: Any = ""
    op: str = "add"  #: ``add``, ``mul`` or ``set``: the new input is ``op(input, value)``
    value: float = 1.0  #: the operand
    slot: int = 0  #: which positional input is replaced
    kwarg: Optional[str] = None  #: a keyword input to replace instead of a positional one (null: ``slot``)

    def check(self, key: str) -> None:
        super().check(key)
        if self.op not in OPS:
            raise choice_error(f"{key}.op", self.op, OPS, "op")
        _check_value(key, self.value)
        if self.slot < 0:
            raise ConfigError(f"{key}.slot: {self.slot} is not a positional index (0 is the first input)")
        if self.kwarg is not None and self.scope == "global":
            raise ConfigError(f"{key}.kwarg: global pre-hooks cannot see keyword inputs; use scope=module")


@dataclass
class EditOutputSpec(SlotEditSpec):
    op: str = "add_input"  #: ``add_input`` (output + first input, a residual), ``add``, ``mul`` or ``set``
    value: float = 0.0  #: the operand of ``add``, ``mul`` and ``set``

    def check(self, key: str) -> None:
        super().check(key)
        if self.op not in OUTPUT_OPS:
            raise choice_error(f"{key}.op", self.op, OUTPUT_OPS, "op")
        _check_value(key, self.value)


HOOK_TYPES.declare("shift", "hooks.types.edits", ShiftSpec)
HOOK_TYPES.declare("edit_output", "hooks.types.edits", EditOutputSpec)
