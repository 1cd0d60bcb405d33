"""Hook types that change a module's inputs or outputs during forward.

* ``shift``: forward pre-hook replacing one input (positional ``slot``, default 0, or keyword
  ``kwarg``, read with ``with_kwargs=True``) by ``op(input, value)``; the tutorials' ``input + 1``.
* ``edit_output``: forward hook replacing the output by ``op(output, value)``; ``op: add_input``
  is the tutorials' residual ``output + inputs[0]``.

Each records statistics of the tensor it produced (kind ``input`` or ``output``).
"""
from __future__ import annotations

from typing import Any

import torch

from common.errors import ConfigError
from hooks.mechanism.registry import register
from hooks.mechanism.tap import Tap
from hooks.specs.edits import EditOutputSpec, ShiftSpec

OPS = {
    "add": lambda x, v: x + v,
    "mul": lambda x, v: x * v,
    "set": lambda x, v: torch.full_like(x, v),
}


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
