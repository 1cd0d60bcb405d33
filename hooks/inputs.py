"""``shift``: a forward pre-hook that changes a module's first positional input.

``op: add`` adds ``value`` (the tutorials' ``input + 1``), ``mul`` multiplies by it, ``set``
fills the input with it. The new input's statistics are recorded as kind ``input``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hooks.base import HookSpec, HookType
from hooks.errors import ConfigError, choice_error
from hooks.registry import register

OPS = {
    "add": lambda x, v: x + v,
    "mul": lambda x, v: x * v,
    "set": lambda x, v: torch.full_like(x, v),
}


@dataclass
class ShiftSpec(HookSpec):
    layers: Any = ""
    op: str = "add"
    value: float = 1.0

    def check(self, key: str) -> None:
        if self.op not in OPS:
            raise choice_error(f"{key}.op", self.op, OPS, "op")
        if math.isnan(self.value):
            raise ConfigError(f"{key}.value: NaN would poison every activation after this layer")


@register("shift")
class Shift(HookType):
    """Forward pre-hook returning ``(op(inputs[0], value), *inputs[1:])``."""

    spec_class = ShiftSpec

    def attach(self, model: nn.Module, session) -> None:
        recorder, hook, op, value = session.recorder, self.name, OPS[self.spec.op], self.spec.value
        for layer, module in self.targets(model):
            def on_pre_forward(module, args, layer=layer):
                if not args or not isinstance(args[0], torch.Tensor):
                    raise ConfigError(f"hooks.{hook}: module '{layer}' was called without a positional "
                                      f"tensor input, so there is nothing to shift")
                new = op(args[0], value)
                recorder.record(new, hook=hook, layer=layer, phase="forward", kind="input", slot="0",
                                call=recorder.next_call((hook, layer)))
                return (new, *args[1:])

            session.add(module.register_forward_pre_hook(on_pre_forward))
