"""Observer hook types: they record (and print) what flows through a module, never change it.

* ``stats``: statistics of inputs / outputs (forward hook) and output gradients (a tensor hook
  registered on the output from the forward hook).
* ``capture``: the same, keeping a copy of every tensor for ``tensors.parquet`` (the tutorial's
  feature extractor).
* ``print``: prints ``NAME: torch.Size([...])`` per call, in call order, and records output stats.

Output gradients are taken with a tensor hook on the module's output, not a full backward hook:
full backward hooks raise on every module whose output is later modified in place, which is
most of a torchvision ResNet (``ReLU(inplace=True)``, ``out += identity``). A tensor hook
registered before the in-place op receives the gradient of the value the module produced.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hooks.base import HookSpec, HookType, observer
from hooks.errors import ConfigError, choice_error
from hooks.recorder import walk
from hooks.registry import register

KINDS = ("input", "output", "grad_output")


@dataclass
class ObserveSpec(HookSpec):
    """``kinds``: which of ``input``, ``output``, ``grad_output`` to record."""

    layers: Any = "leaf:**"
    kinds: list[str] = field(default_factory=lambda: ["output", "grad_output"])

    def check(self, key: str) -> None:
        if not self.kinds:
            raise ConfigError(f"{key}.kinds: empty; choose from {', '.join(KINDS)}")
        for kind in self.kinds:
            if kind not in KINDS:
                raise choice_error(f"{key}.kinds", kind, KINDS, "kind")


class Observe(HookType):
    """Forward hook recording inputs/outputs; output gradients through a tensor hook."""

    spec_class = ObserveSpec
    keep = False

    @property
    def needs_backward(self) -> bool:
        return "grad_output" in self.spec.kinds

    def attach(self, model: nn.Module, session) -> None:
        for name, module in self.targets(model):
            session.add(module.register_forward_hook(observer(self._forward_hook(name, session.recorder))))

    def _forward_hook(self, layer: str, recorder):
        hook, keep, kinds = self.name, self.keep, set(self.spec.kinds)

        def on_forward(module, args, output) -> None:
            call = recorder.next_call((hook, layer))
            if "input" in kinds:
                for slot, t in walk(args):
                    recorder.record(t, hook=hook, layer=layer, phase="forward", kind="input",
                                    slot=slot, call=call, keep=keep)
            for slot, t in walk(output):
                if "output" in kinds:
                    recorder.record(t, hook=hook, layer=layer, phase="forward", kind="output",
                                    slot=slot, call=call, keep=keep)
                if "grad_output" in kinds and t.requires_grad:
                    t.register_hook(observer(self._grad_hook(recorder, layer, slot, call)))

        return on_forward

    def _grad_hook(self, recorder, layer: str, slot: str, call: int):
        hook, keep = self.name, self.keep

        def on_grad(grad) -> None:
            recorder.record(grad, hook=hook, layer=layer, phase="backward", kind="grad_output",
                            slot=slot, call=call, keep=keep)

        return on_grad


@register("stats")
class Stats(Observe):
    """Statistics only: the cheap way to watch every layer."""


@dataclass
class CaptureSpec(ObserveSpec):
    kinds: list[str] = field(default_factory=lambda: ["output"])


@register("capture")
class Capture(Observe):
    """Statistics plus a copy of each tensor, written to ``tensors.parquet``."""

    spec_class = CaptureSpec
    keep = True


@dataclass
class PrintSpec(HookSpec):
    layers: Any = "*"


@register("print")
class Print(HookType):
    """Forward hook printing each output's shape, as the tutorials' ``VerboseExecution`` does."""

    spec_class = PrintSpec

    def attach(self, model: nn.Module, session) -> None:
        recorder, hook = session.recorder, self.name
        for layer, module in self.targets(model):
            def on_forward(module, args, output, layer=layer) -> None:
                call = recorder.next_call((hook, layer))
                for slot, t in walk(output):
                    suffix = "" if slot == "0" else f"[{slot}]"
                    print(f"{layer or '(model)'}{suffix}: {t.shape}", flush=True)
                    recorder.record(t, hook=hook, layer=layer, phase="forward", kind="output",
                                    slot=slot, call=call)

            session.add(module.register_forward_hook(observer(on_forward)))
