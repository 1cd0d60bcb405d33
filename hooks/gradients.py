"""Gradient-changing hook types: ``clamp``, ``scale`` and ``replace``.

One mechanism, three transforms. ``target`` says where the gradient is taken:

* ``params``: ``Tensor.register_hook`` on each parameter of the selected modules (optionally
  only those named in ``params``, e.g. ``[bias]``), as the tutorials' ``gradient_clipper`` does;
  the accumulated ``.grad`` is recorded again after backward (phase ``after_backward``).
* ``output``: a tensor hook on each output, registered from a forward hook (the tutorial's
  "ReLU output gradients >= 0").
* ``input``: a forward pre-hook passes each grad-requiring positional input through
  ``view_as`` and hooks that view, so only this module's share of the input gradient changes.

Each hook records statistics of the gradient it produced, so a run shows what it did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from hooks.base import HookSpec, HookType
from hooks.errors import ConfigError, choice_error
from hooks.recorder import walk
from hooks.registry import register

TARGETS = ("params", "output", "input")
_KIND = {"params": "param_grad", "output": "grad_output", "input": "grad_input"}


@dataclass
class GradSpec(HookSpec):
    layers: Any = "**"
    target: str = "params"
    params: Optional[list[str]] = None

    def check(self, key: str) -> None:
        if self.target not in TARGETS:
            raise choice_error(f"{key}.target", self.target, TARGETS, "target")
        if self.params is not None and self.target != "params":
            raise ConfigError(f"{key}.params: only meaningful with target=params (got target={self.target})")
        if self.params is not None and not self.params:
            raise ConfigError(f"{key}.params: empty list; use null for every parameter or name some, e.g. [bias]")


class GradTransform(HookType):
    """Shared attach logic; subclasses define ``transform(grad) -> new grad``."""

    spec_class = GradSpec
    _params: list[tuple[str, str, nn.Parameter]] = []

    @property
    def needs_backward(self) -> bool:
        return True

    @property
    def compile_problem(self) -> str | None:
        # Parameter hooks run in the eager autograd engine, after the compiled backward; hooks on
        # activations (output/input) break the compiled graph on every call (measured, torch 2.14).
        if self.spec.target == "params":
            return None
        return f"changes activation gradients through tensor hooks (target={self.spec.target})"

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attach(self, model: nn.Module, session) -> None:
        modules = self.targets(model)
        recorder, target = session.recorder, self.spec.target
        if target == "params":
            self._params = self._select_params(modules)
            for layer, pname, p in self._params:
                session.add(p.register_hook(self._grad_hook(recorder, layer, pname, None)))
            return
        for layer, module in modules:
            if target == "output":
                session.add(module.register_forward_hook(self._output_hook(recorder, layer)))
            else:
                session.add(module.register_forward_pre_hook(self._input_hook(recorder, layer)))

    def _select_params(self, modules: list[tuple[str, nn.Module]]) -> list[tuple[str, str, nn.Parameter]]:
        wanted = self.spec.params
        seen: set[int] = set()
        out, names_found = [], set()
        for layer, module in modules:
            for pname, p in module.named_parameters(recurse=False):
                names_found.add(pname)
                if (wanted is None or pname in wanted) and id(p) not in seen and p.requires_grad:
                    seen.add(id(p))
                    out.append((layer, pname, p))
        for pname in wanted or ():
            if pname not in names_found:
                raise choice_error(f"{self.key}.params", pname, names_found or ["(none)"],
                                   "parameter name in the selected modules")
        if not out:
            raise ConfigError(f"{self.key}.layers: the selected modules have no trainable parameters; "
                              f"select modules that own parameters or use target=output")
        return out

    def _grad_hook(self, recorder, layer: str, slot: str, call: int | None):
        hook, kind, transform = self.name, _KIND[self.spec.target], self.transform

        def on_grad(grad: torch.Tensor) -> torch.Tensor:
            new = transform(grad)
            n = call if call is not None else recorder.next_call((hook, layer, slot))
            recorder.record(new, hook=hook, layer=layer, phase="backward", kind=kind, slot=slot, call=n)
            return new

        return on_grad

    def _output_hook(self, recorder, layer: str):
        def on_forward(module, args, output) -> None:
            call = recorder.next_call((self.name, layer))
            for slot, t in walk(output):
                if t.requires_grad:
                    t.register_hook(self._grad_hook(recorder, layer, slot, call))

        return on_forward

    def _input_hook(self, recorder, layer: str):
        def on_pre_forward(module, args):
            call = recorder.next_call((self.name, layer))
            new_args, changed = list(args), False
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    view = a.view_as(a)
                    view.register_hook(self._grad_hook(recorder, layer, str(i), call))
                    new_args[i], changed = view, True
            return tuple(new_args) if changed else None

        return on_pre_forward

    def after_backward(self, recorder) -> None:
        for layer, pname, p in self._params:
            if p.grad is not None:
                recorder.record(p.grad, hook=self.name, layer=layer, phase="after_backward",
                                kind="param_grad", slot=pname, call=0)


@dataclass
class ClampSpec(GradSpec):
    min: Optional[float] = None
    max: Optional[float] = None

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


@register("clamp")
class Clamp(GradTransform):
    """Clamp each gradient element to ``[min, max]`` (either bound may be null)."""

    spec_class = ClampSpec

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.clamp(self.spec.min, self.spec.max)


@dataclass
class ScaleSpec(GradSpec):
    factor: float = 2.0


@register("scale")
class Scale(GradTransform):
    """Multiply the gradient by ``factor`` (the tutorials' doubled gradient)."""

    spec_class = ScaleSpec

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.spec.factor


@dataclass
class ReplaceSpec(GradSpec):
    value: float = 0.0


@register("replace")
class Replace(GradTransform):
    """Replace every gradient element by ``value`` (zero for the tutorials' ``zero_bias``)."""

    spec_class = ReplaceSpec

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, self.spec.value)
