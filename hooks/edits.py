"""Hook types that change a module's inputs or outputs during forward.

* ``shift``: forward pre-hook replacing one input (positional ``slot``, default 0, or keyword
  ``kwarg``, read with ``with_kwargs=True``) by ``op(input, value)``; the tutorials' ``input + 1``.
* ``edit_output``: forward hook replacing the output by ``op(output, value)``; ``op: add_input``
  is the tutorials' residual ``output + inputs[0]``.

Each records statistics of the tensor it produced (kind ``input`` or ``output``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from common.errors import ConfigError, choice_error
from hooks.registry import register
from hooks.tap import EditSpec, SlotEditSpec, Tap

OPS = {
    "add": lambda x, v: x + v,
    "mul": lambda x, v: x * v,
    "set": lambda x, v: torch.full_like(x, v),
}


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


@register("shift")
class Shift(Tap):
    """Forward pre-hook returning the inputs with one of them replaced by ``op(input, value)``."""

    spec_class = ShiftSpec

    def edit_input(self):
        op, value = OPS[self.spec.op], self.spec.value
        return lambda x: op(x, value)

    @property
    def edited_input(self) -> tuple[str, str]:
        return ("kwarg", self.spec.kwarg) if self.spec.kwarg is not None else ("slot", str(self.spec.slot))


OUTPUT_OPS = ("add_input", *OPS)


@dataclass
class EditOutputSpec(SlotEditSpec):
    op: str = "add_input"  #: ``add_input`` (output + first input, a residual), ``add``, ``mul`` or ``set``
    value: float = 0.0  #: the operand of ``add``, ``mul`` and ``set``

    def check(self, key: str) -> None:
        super().check(key)
        if self.op not in OUTPUT_OPS:
            raise choice_error(f"{key}.op", self.op, OUTPUT_OPS, "op")
        _check_value(key, self.value)


@register("edit_output")
class EditOutput(Tap):
    """Forward hook returning ``op(output, value)``, or ``output + inputs[0]`` for ``add_input``."""

    spec_class = EditOutputSpec

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        self._layer = layer  # the module the residual is added at, for its shape error

    def edit_output(self):
        value = self.spec.value
        if self.spec.op != "add_input":
            op = OPS[self.spec.op]
            return lambda out, args: op(out, value)
        return self._add_input

    def _add_input(self, out: torch.Tensor, args: tuple) -> torch.Tensor:
        """``out + args[0]``; a module whose output has another shape than its input (a convolution
        changing channels, a projection) is named, with both shapes."""
        if not args or not isinstance(args[0], torch.Tensor):
            raise ConfigError(f"{self.key}.op: add_input needs a positional tensor input, and module "
                              f"'{self._layer}' was called without one")
        if args[0].shape != out.shape:
            raise ConfigError(f"{self.key}.op: add_input on module '{self._layer}' adds its input "
                              f"{list(args[0].shape)} to its output {list(out.shape)}, which differ in shape: "
                              f"select a module that keeps the shape ({self.key}.layers)")
        return out + args[0]
