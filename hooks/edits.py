"""Hook types that change a module's inputs or outputs during forward.

* ``shift``: forward pre-hook replacing one input (positional ``slot``, default 0, or keyword
  ``kwarg``, read with ``with_kwargs=True``) by ``op(input, value)``; the tutorials' ``input + 1``.
* ``edit_output``: forward hook replacing the output by ``op(output, value)``; ``op: add_input``
  is the tutorials' residual ``output + inputs[0]``.

Each records statistics of the tensor it produced (kind ``input`` or ``output``).
"""
from __future__ import annotations

import torch

from common.errors import ConfigError
from hooks.registry import register
from hooks.tap import Tap
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

    def edit_output(self):
        value, key = self.spec.value, self.key
        if self.spec.op != "add_input":
            op = OPS[self.spec.op]
            return lambda out, args: op(out, value)

        def add_input(out: torch.Tensor, args: tuple) -> torch.Tensor:
            if not args or not isinstance(args[0], torch.Tensor):
                raise ConfigError(f"{key}.op: add_input needs a positional tensor input, and the module "
                                  f"was called without one")
            if args[0].shape != out.shape:
                raise ConfigError(f"{key}.op: add_input needs input and output of one shape; got input "
                                  f"{list(args[0].shape)} and output {list(out.shape)}: select a module "
                                  f"that keeps the shape ({key}.layers)")
            return out + args[0]

        return add_input
