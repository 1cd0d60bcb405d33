"""``stats``, ``capture`` and ``print`` (``hooks.types.observe``): what each records."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import TapSpec, check_kinds


@dataclass
class ObserveSpec(TapSpec):
    layers: Any = "leaf:**"
    kinds: list[str] = field(default_factory=lambda: ["output", "grad_output"])  #: what is recorded: ``input``, ``output``, ``grad_input``, ``grad_output``

    def check(self, key: str) -> None:
        super().check(key)
        check_kinds(key, self.kinds)


@dataclass
class CaptureSpec(ObserveSpec):
    kinds: list[str] = field(default_factory=lambda: ["output"])


@dataclass
class PrintSpec(ObserveSpec):
    layers: Any = "*"
    kinds: list[str] = field(default_factory=lambda: ["output"])
    values: bool = False  #: true: print the values, not only the shape


HOOK_TYPES.declare("stats", "hooks.types.observe", ObserveSpec)
HOOK_TYPES.declare("capture", "hooks.types.observe", CaptureSpec)
HOOK_TYPES.declare("print", "hooks.types.observe", PrintSpec)
