"""Module backward hooks and autograd Node hooks.

* ``full_backward``: ``grad_input`` and ``grad_output`` of each call, optionally replacing every
  ``grad_input`` by ``replace_grad_input`` (the tutorials' 42).
* ``backward_pre``: ``grad_output`` of each call, optionally replaced by ``replace_grad_output``.
* ``node``: ``grad_fn.register_prehook`` (kind ``grad_output``: the gradient arriving at the
  output's autograd Node) and ``grad_fn.register_hook`` (kind ``grad_input``: what the Node
  passes on to its inputs) on the selected modules' outputs.

``mechanism: tensor`` (the default) takes the gradients with tensor hooks (see ``hooks.mechanism.tap``),
which gives the same numbers as ``register_full_backward_hook`` and keeps working when the
module's output is modified in place afterwards (a stock torchvision ResNet), where PyTorch's
full backward hooks raise "Output 0 of BackwardHookFunction is a view and is being modified
inplace". ``mechanism: module`` registers PyTorch's ``register_full_backward_hook`` /
``register_full_backward_pre_hook`` (``register_module_full_backward_*`` for ``scope: global``)
exactly; the deprecated ``register_backward_hook`` is never used. Its rows carry the forward
call they belong to (see ``PerCall``), so they join forward rows on ``(layer, call)``. Entries of
the two mechanisms on one module cannot keep config order between them (PyTorch runs module
backward hooks inside the tensor hooks around the module): when one of them changes gradients,
attaching fails with one line. ``node`` hooks fire after every tensor hook on the same output
(PyTorch's order: tensor hooks, then the Node's pre-hooks, the Node, its post-hooks).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from common.errors import ConfigError
from hooks.mechanism.junction import junction_for
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.specs.index import narrowed
from hooks.mechanism.tap import Tap, apply_edit
from hooks.specs.backward import BackwardSpec, NodeSpec


class PerCall:
    """A PyTorch module backward hook whose callback knows the forward call it belongs to.

    PyTorch copies a module's backward hooks when a call starts and calls that copy in backward,
    passing only the module. So the callback registered at the start of call ``c`` is bound to a
    fresh ``calls`` dict that the forward pre-hook of call ``c`` fills (module id -> call number),
    and the forward hook of call ``c`` registers the next callback in its place (``renew``).
    Renewing in config order, prepended entries at the front and the others at the back, keeps
    the order PyTorch gives hooks registered once. ``remove`` is the handle the session holds.
    """

    def __init__(self, register, make_callback) -> None:
        self._register, self._make = register, make_callback
        self.calls: dict[int, int] = {}
        self._handle = register(make_callback(self.calls))

    def renew(self) -> None:
        self._handle.remove()
        self.calls = {}
        self._handle = self._register(self._make(self.calls))

    def remove(self) -> None:
        self._handle.remove()


class ModuleBackward(Tap):
    """Shared logic: ``replaced_kind`` is the kind that ``replace`` overwrites."""

    spec_class = BackwardSpec
    replaced_kind = "grad_input"

    needs_backward = True

    def _filler(self):
        value = self.spec.replace
        return None if value is None else (lambda g: torch.full_like(g, value))

    def edit_grad_input(self):
        return self._filler() if self.replaced_kind == "grad_input" else None

    def edit_grad_output(self):
        return self._filler() if self.replaced_kind == "grad_output" else None

    @property
    def pytorch_hooks(self) -> str:
        if self.spec.mechanism == "tensor":
            return super().pytorch_hooks
        register = self.global_register if self.spec.scope == "global" else self.local_register
        prefix = "register_module_" if self.spec.scope == "global" else "register_"
        return f"{register.__doc__} (+ {prefix}forward_pre_hook / {prefix}forward_hook numbering calls)"

    def explain(self, exc: BaseException) -> str | None:
        """The one-line fix for PyTorch's in-place error under ``mechanism: module``, else ``None``.

        PyTorch raises it (during forward, at the in-place op after the hooked module) with
        "BackwardHookFunction" in the message ("BackwardHookFunctionBackward" before torch 2.1).
        """
        if self.spec.mechanism != "module" or "BackwardHookFunction" not in str(exc):
            return None
        return (f"{self.key}.mechanism=module: PyTorch's full backward hook fails on a module whose output "
                f"or input is modified in place (e.g. by ReLU(inplace=True) or 'out += identity'); "
                f"use mechanism=tensor, which records the same gradients")

    def attach(self, model: nn.Module, session) -> None:
        if self.spec.mechanism == "tensor":
            return super().attach(model, session)
        self._start(session)
        targets = self.targets(model)
        for layer, module in targets:  # checked against tensor-mechanism entries on the same module
            session.add(junction_for(module).join(self, is_global=self.spec.scope == "global",
                                                  prepend=self.spec.prepend, layer=layer, mechanism="module",
                                                  edits=self.spec.replace is not None))
        if self.spec.scope == "global":
            names = {id(m): n for n, m in targets}
            def name_of(module):
                return names.get(id(module))

            hook = PerCall(self.global_register, lambda calls: self._module_hook(name_of, calls))
            session.add(hook)
            self._number_calls(session, hook, nn_module.register_module_forward_pre_hook,
                               nn_module.register_module_forward_hook, name_of)
            return
        for layer, module in targets:
            hook = PerCall(lambda cb, module=module: self.local_register(module, cb),
                           lambda calls, layer=layer: self._module_hook(lambda _m: layer, calls))
            session.add(hook)
            self._number_calls(session, hook, module.register_forward_pre_hook,
                               module.register_forward_hook, lambda _m, layer=layer: layer)

    def _number_calls(self, session, hook: PerCall, register_pre, register_forward, name_of) -> None:
        """Fill ``hook.calls`` at each call's start and renew ``hook`` after the call."""
        def on_pre(module, args):
            layer = name_of(module)
            if layer is not None:
                hook.calls[id(module)] = self._recorder.next_call((self.name, layer))

        def on_forward(module, args, output):
            layer = name_of(module)
            if layer is None:
                return
            hook.renew()
            if not isinstance(output, (torch.Tensor, tuple)):  # PyTorch only warns and skips the hooks
                raise ConfigError(f"{self.key}.mechanism=module: '{layer}' returns {type(output).__name__}, and "
                                  f"PyTorch's module backward hooks fire only for a tensor or a tuple of "
                                  f"tensors; use mechanism=tensor, which hooks every tensor inside")

        session.add(register_pre(on_pre))
        session.add(register_forward(on_forward))

    def _replace_all(self, grads: tuple, kind: str, layer: str):
        fill = narrowed(self._filler(), self.index)
        if fill is None:
            return None
        where = f"{self.key} on '{layer}' {kind}"
        return tuple(None if g is None else apply_edit(fill, g, where) for g in grads)

    def _record_all(self, grads: tuple, kind: str, layer: str, call: int) -> None:
        for i, g in enumerate(grads):
            if isinstance(g, torch.Tensor):
                self._record(g, layer, "backward", kind, str(i), call)


@register("full_backward")
class FullBackward(ModuleBackward):
    """``grad_input``/``grad_output`` of each call; ``replace`` overwrites every ``grad_input``."""

    record_kinds = frozenset({"grad_input", "grad_output"})

    def local_register(self, module, callback):
        """register_full_backward_hook"""
        return module.register_full_backward_hook(callback, prepend=self.spec.prepend)

    def global_register(self, callback):
        """register_module_full_backward_hook"""
        return nn_module.register_module_full_backward_hook(callback)

    def _module_hook(self, name_of, calls: dict[int, int]):
        def on_backward(module, grad_input, grad_output):
            layer = name_of(module)
            if layer is None:
                return None
            call = calls[id(module)]
            self._record_all(grad_output, "grad_output", layer, call)
            new = self._replace_all(grad_input, "grad_input", layer)
            self._record_all(new if new is not None else grad_input, "grad_input", layer, call)
            return new

        return on_backward


@register("backward_pre")
class BackwardPre(ModuleBackward):
    """``grad_output`` of each call before the module's backward; ``replace`` overwrites it."""

    replaced_kind = "grad_output"

    record_kinds = frozenset({"grad_output"})

    def local_register(self, module, callback):
        """register_full_backward_pre_hook"""
        return module.register_full_backward_pre_hook(callback, prepend=self.spec.prepend)

    def global_register(self, callback):
        """register_module_full_backward_pre_hook"""
        return nn_module.register_module_full_backward_pre_hook(callback)

    def _module_hook(self, name_of, calls: dict[int, int]):
        def on_backward_pre(module, grad_output):
            layer = name_of(module)
            if layer is None:
                return None
            new = self._replace_all(grad_output, "grad_output", layer)
            self._record_all(new if new is not None else grad_output, "grad_output", layer, calls[id(module)])
            return new

        return on_backward_pre


@register("node")
class NodeHooks(Tap):
    """Node pre-hooks (``grad_output``) and post-hooks (``grad_input``) on each output's ``grad_fn``."""

    spec_class = NodeSpec

    needs_backward = True

    wants_forward_hook = True

    @property
    def expected_kinds(self) -> set[str]:
        return set(self.spec.kinds)

    @property
    def pytorch_hooks(self) -> str:
        prefix = "register_module_" if self.spec.scope == "global" else "register_"
        return f"{prefix}forward_hook + grad_fn.register_prehook / grad_fn.register_hook on output"

    def on_forward(self, layer: str, call: int, args: tuple, output) -> None:
        kinds = set(self.spec.kinds)
        for slot, t in walk(output):
            node = t.grad_fn
            if node is None:
                continue
            if "grad_output" in kinds:
                node.register_prehook(self._node_hook(layer, slot, call, "grad_output"))
            if "grad_input" in kinds:
                node.register_hook(self._node_hook(layer, slot, call, "grad_input"))

    def _node_hook(self, layer: str, slot: str, call: int, kind: str):
        def on_node(*grads) -> None:  # pre-hook: (grad_outputs,); post-hook: (grad_inputs, grad_outputs)
            for i, g in enumerate(grads[0]):
                if isinstance(g, torch.Tensor):
                    self._record(g, layer, "backward", kind, f"{slot}.{i}", call)

        return on_node
