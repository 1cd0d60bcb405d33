"""Gradient-changing hook types: ``clamp``, ``scale`` and ``replace``.

One mechanism, three transforms. ``target`` says where the gradient is taken:

* ``params``: ``Tensor.register_hook`` on each parameter of the selected modules (optionally
  only those named in ``params``, e.g. ``[bias]``), as the tutorials' ``gradient_clipper`` does;
  the accumulated ``.grad`` is recorded again after backward (phase ``after_backward``). Entries
  on one parameter share one tensor hook (``hooks.mechanism.junction.ParamLineup``) that calls them in
  config order, ``prepend`` first, each on what the previous returned.
* ``output``: a tensor hook on each output (kind ``grad_output``; see ``hooks.mechanism.tap``).
* ``input``: a tensor hook on this module's view of each positional or keyword input
  (kind ``grad_input``), so other consumers of the same tensor are not affected.

With ``output`` or ``input``, every tensor's gradient is changed, or only the one ``slot`` names
(an LSTM's ``h_n`` is output slot ``1.0``); a slot that names no tensor of the call is one line
listing those it has, at the first call (``Tap.grad_slot``).

Each hook records statistics of the gradient it produced, so a run shows what it did; ``clamp``
also records what it removed (kind ``clipped``). ``record: false`` (``target: params`` only) records
nothing: a tensor op per parameter and row (statistics, the ``after_backward`` row, ``clipped``'s
subtraction) go, and what is left is the edit itself.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from common.errors import ConfigError, choice_error
from hooks.mechanism import shards
from hooks.mechanism.junction import param_lineup
from hooks.mechanism.registry import register
from hooks.specs.index import narrowed
from hooks.mechanism.tap import Tap, apply_edit
from hooks.specs.gradients import ClampSpec, GradSpec, ReplaceSpec, ScaleSpec


def select_params(hook: Tap, modules: list[tuple[str, nn.Module]],
                  wanted: list[str] | None) -> list[tuple[str, str, nn.Parameter]]:
    """``(layer, name, parameter)`` for the trainable parameters the selected modules own directly.

    Each parameter appears once, under the first module that owns it; a name in ``wanted`` that
    no selected module has is an error suggesting the names they do have.
    """
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
            raise choice_error(f"{hook.key}.params", pname, names_found or ["(none)"], "parameter")
    if not out:
        raise ConfigError(f"{hook.key}.layers: the selected modules have no trainable parameters; "
                          f"select modules that own parameters")
    return out


class GradTransform(Tap):
    """Shared logic; subclasses define ``transform(grad) -> new grad``."""

    spec_class = GradSpec
    _params: list[tuple[str, str, nn.Parameter]] = []

    needs_backward = True

    @property
    def compile_problem(self) -> str | None:
        # Parameter hooks run in the eager autograd engine, after the compiled backward; hooks on
        # activations (output/input) break the compiled graph on every call (measured, torch 2.14).
        if self.spec.target == "params":
            return None
        return f"changes activation gradients through tensor hooks (target={self.spec.target})"

    @property
    def expected_kinds(self) -> set[str]:
        if self.spec.target == "params":
            return {"param_grad"} if self.records_params else set()
        return super().expected_kinds

    @property
    def records_params(self) -> bool:
        """Whether the parameters' gradients are recorded (``target: params`` with ``record: true``, the
        default): the one place ``record`` is read."""
        return self.spec.target == "params" and self.spec.record

    @property
    def acts_after_backward(self) -> bool:
        if self.spec.target == "params" and not self.records_params:  # nothing to record after backward
            return self.spec.max_calls is not None
        return super().acts_after_backward

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def edit_grad_input(self):
        return self.transform if self.spec.target == "input" else None

    def edit_grad_output(self):
        return self.transform if self.spec.target == "output" else None

    @property
    def pytorch_hooks(self) -> str:
        return "Tensor.register_hook on parameters (shared)" if self.spec.target == "params" else super().pytorch_hooks

    def attach(self, model: nn.Module, session) -> None:
        if self.spec.target != "params":
            return super().attach(model, session)
        self._start(session)
        self._session = session
        self._params = select_params(self, self.targets(model), self.spec.params)
        if self.index is not None:
            shards.refuse_sharded(self._params, f"{self.key}.index", "change elements at positions of the "
                                  "whole gradient, which a rank's shard does not know")
        for layer, pname, p in self._params:  # one shared hook per parameter orders the entries
            session.add(param_lineup(p).join(self, prepend=self.spec.prepend,
                                             callback=self._param_hook(session.recorder, layer, pname)))

    def _param_hook(self, recorder, layer: str, slot: str):
        where = f"{self.key} on '{layer}' param_grad {slot}"
        transform = narrowed(self.transform, self.index)
        key = (self.name, layer, slot)
        if not self.records_params:
            def edit_only(grad: torch.Tensor) -> torch.Tensor:
                recorder.next_call(key)  # counted: max_calls and the manifest's calls
                return apply_edit(transform, grad, where)

            return edit_only

        def on_grad(grad: torch.Tensor) -> torch.Tensor:
            new = apply_edit(transform, grad, where)
            call = recorder.next_call(key)
            recorder.record(new, hook=self.name, layer=layer, phase="backward", kind="param_grad",
                            slot=slot, call=call)
            self.on_grad_edit(layer, slot, call, grad, new)
            return new

        return on_grad

    @property
    def grad_slot(self) -> str | None:
        return None if self.spec.slot is None else str(self.spec.slot)

    def after_backward(self, recorder) -> None:
        super().after_backward(recorder)  # activation targets: fail if PyTorch dropped a hook
        for layer, pname, p in self._params if self.records_params else ():
            grad = self._session.landed_grad(p)
            if grad is not None:
                recorder.record(grad, hook=self.name, layer=layer, phase="after_backward",
                                kind="param_grad", slot=pname, call=0)

    def grads_after_backward(self) -> list[nn.Parameter]:
        return [p for _, _, p in self._params] if self.records_params else []


@register("clamp")
class Clamp(GradTransform):
    """Clamp each gradient element to ``[min, max]`` (either bound may be null)."""

    spec_class = ClampSpec

    @property
    def transform(self):
        """``torch.clamp`` with the bounds bound: the edit runs per gradient with no Python call of its own."""
        return functools.partial(torch.clamp, min=self.spec.min, max=self.spec.max)

    def on_grad_edit(self, layer: str, slot: str, call: int, grad: torch.Tensor, new: torch.Tensor) -> None:
        """Record what the clamp removed (kind ``clipped``: ``grad - clamped``, 0 where nothing was
        clipped, so ``1 - zero_frac`` is the fraction of elements clipped); one subtraction a call."""
        self._recorder.record(grad - new, hook=self.name, layer=layer, phase="backward", kind="clipped",
                              slot=slot, call=call)


@register("scale")
class Scale(GradTransform):
    """Multiply the gradient by ``factor`` (the tutorials' doubled gradient)."""

    spec_class = ScaleSpec

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.spec.factor


@register("replace")
class Replace(GradTransform):
    """Replace every gradient element by ``value`` (zero for ``zero_bias``, 42 in the tutorials)."""

    spec_class = ReplaceSpec

    def transform(self, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, self.spec.value)
