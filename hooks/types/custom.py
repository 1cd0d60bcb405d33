"""``custom``: a researcher's own function registered as any PyTorch hook, exactly as by hand.

``fn: mypkg.hooks.my_hook`` names an importable callable (resolved and its arity checked while
the config is checked, see ``hooks.callables``); ``hook`` says which PyTorch function registers
it on each selected module, called with PyTorch's own arguments:

=================  =====================================================  ==================
``hook``           registered with                                        records
=================  =====================================================  ==================
``forward_pre``    ``register_forward_pre_hook`` (``with_kwargs``)        ``input``
``forward``        ``register_forward_hook`` (``with_kwargs``,            ``output``
                   ``always_call``)
``full_backward``  ``register_full_backward_hook``                        ``grad_input``,
                                                                          ``grad_output``
``backward_pre``   ``register_full_backward_pre_hook``                    ``grad_output``
``tensor``         ``Tensor.register_hook`` on each output (``target:     ``grad_output`` /
                   output``, from a forward hook) or parameter            ``param_grad``
                   (``target: params``)
``post_accumulate`` ``Tensor.register_post_accumulate_grad_hook``         ``param_grad``
=================  =====================================================  ==================

What ``fn`` returns is returned to PyTorch unchanged, so a replacement (new inputs, output or
gradients) acts exactly as in PyTorch. Each call's tensors go to the same tables as every
other type's: those ``fn`` returned when it returned a replacement, else those it saw.
``prepend`` is PyTorch's (module hooks only: ``Tensor.register_hook`` has none).

``fn`` is rehearsed like every type's hooks: the meta-device rehearsal (``plan=true``, the gate,
``runner.attach``'s first call) calls it on meta tensors (shapes, no values; not counted by
``max_calls``), so a replacement of another shape (an output, a gradient) is one line naming the
entry and the layer before the run. A ``fn`` that reads values (``.item()``) is left to the real
run there; a ``fn`` that keeps what it sees can skip the rehearsal's call (``if output.is_meta``).
``post_accumulate``'s ``fn`` is not called on meta: PyTorch ignores what it returns.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from hooks.mechanism.base import HookType
from hooks.mechanism import shards
from hooks.types.gradients import select_params
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.specs.custom import CustomSpec


@register("custom")
class Custom(HookType):
    """Registers ``spec.fn`` with the PyTorch function ``spec.hook`` names; records what it saw or returned."""

    spec_class = CustomSpec

    def __init__(self, name: str, spec: CustomSpec) -> None:
        super().__init__(name, spec)
        self.fn = spec.callable(self.key)
        self._made = 0  # calls passed to ``fn`` over the run: max_calls stops them exactly
        self._reshaped: str | None = None  # the last input shape change fn made, for ``explain``

    @property
    def needs_backward(self) -> bool:
        return self.spec.hook not in ("forward_pre", "forward")

    @property
    def pytorch_hooks(self) -> str:
        spec = self.spec
        if spec.hook == "tensor":
            where = "parameters" if spec.target == "params" else "outputs (from register_forward_hook)"
            return f"Tensor.register_hook({spec.fn}) on {where}"
        if spec.hook == "post_accumulate":
            return f"Tensor.register_post_accumulate_grad_hook({spec.fn}) on parameters"
        name = {"forward_pre": "register_forward_pre_hook", "forward": "register_forward_hook",
                "full_backward": "register_full_backward_hook",
                "backward_pre": "register_full_backward_pre_hook"}[spec.hook]
        return f"{name}({spec.fn})"

    @property
    def expected_kinds(self) -> frozenset[str]:
        hook, target = self.spec.hook, self.spec.target
        if hook == "post_accumulate" or (hook == "tensor" and target == "params"):
            return frozenset({"param_grad"})
        return frozenset({"forward_pre": {"input"}, "forward": {"output"}, "tensor": {"grad_output"},
                          "full_backward": {"grad_input", "grad_output"}, "backward_pre": {"grad_output"}}[hook])

    # -- registration ---------------------------------------------------------------------------
    def attach(self, model: nn.Module, session) -> None:
        self._recorder = session.recorder
        spec = self.spec
        modules = self.targets(model)
        if spec.hook == "post_accumulate" or (spec.hook == "tensor" and spec.target == "params"):
            params = select_params(self, modules, spec.params)
            if spec.hook == "tensor":
                shards.refuse_sharded(params, f"{self.key}.hook", "hand fn the whole gradient through "
                                      "Tensor.register_hook, which FSDP2 never calls; use hook=post_accumulate")
            for layer, pname, p in params:
                if spec.hook == "tensor":
                    session.add(p.register_hook(self._param_grad_hook(layer, pname)))
                else:
                    session.add(p.register_post_accumulate_grad_hook(self._accumulated_hook(layer, pname)))
            return
        for layer, module in modules:
            if spec.hook == "forward_pre":
                session.add(module.register_forward_pre_hook(
                    self._pre_hook(layer), prepend=spec.prepend, with_kwargs=spec.with_kwargs))
            elif spec.hook == "forward":
                session.add(module.register_forward_hook(
                    self._forward_hook(layer), prepend=spec.prepend, with_kwargs=spec.with_kwargs,
                    always_call=spec.always_call))
            elif spec.hook == "full_backward":
                session.add(module.register_full_backward_hook(self._backward_hook(layer), prepend=spec.prepend))
            elif spec.hook == "backward_pre":
                session.add(module.register_full_backward_pre_hook(self._backward_pre_hook(layer),
                                                                   prepend=spec.prepend))
            else:  # tensor hooks on this call's outputs
                session.add(module.register_forward_hook(self._output_tensor_hook(layer)))

    def run_state(self) -> dict:
        return {"made": self._made}

    def restore_run_state(self, state: dict) -> None:
        self._made = state.get("made", 0)

    def _start(self, key: tuple, *tensors: Any) -> tuple[int, bool] | None:
        """The call number and whether the call is the rehearsal's (meta tensors: shapes, no values),
        or ``None`` when ``fn`` must not run: past ``max_calls``, which counts the real calls only."""
        if self.spec.max_calls is not None and self._made >= self.spec.max_calls:
            return None
        meta = any(t.device.type == "meta" for obj in tensors for _, t in walk(obj))
        self._made += not meta
        return self._recorder.next_call(key), meta

    def _call(self, meta: bool, *args: Any) -> Any:
        """``fn(*args)``; in the rehearsal, a ``fn`` that needs values (``.item()``, ``.tolist()``) is
        left to the real run, where it is called on them: ``None``, the call unchanged."""
        if not meta:
            return self.fn(*args)
        try:
            return self.fn(*args)
        except Exception:  # noqa: BLE001 - meta tensors hold no values; the real call shows its own error
            return None

    def _record(self, obj: Any, layer: str, phase: str, kind: str, call: int, prefix: str = "") -> None:
        for slot, t in walk(obj, prefix):
            self._recorder.record(t, hook=self.name, layer=layer, phase=phase, kind=kind, slot=slot, call=call)

    def explain(self, exc: BaseException) -> str | None:
        """A pass that failed after ``fn`` gave a module inputs of other shapes (a forward-pre hook may:
        the module then decides): that change, named with the entry and the layer."""
        if self._reshaped is None or not isinstance(exc, (RuntimeError, ValueError, IndexError)):
            return None
        return f"{self.key}: {self._reshaped}, and the pass then failed: {' '.join(str(exc).split())[:240]}"

    # -- callbacks: fn's arguments and return value pass through untouched ----------------------
    def _pre_hook(self, layer: str):
        def on_pre(module, args, *kwargs):
            started = self._start((self.name, layer), args, *kwargs)
            if started is None:
                return None
            call, meta = started
            result = self._call(meta, module, args, *kwargs)
            if kwargs:  # with_kwargs: PyTorch takes None or (args, kwargs)
                new_args, new_kwargs = (args, kwargs[0]) if result is None else result
                self._note_reshape(layer, (args, kwargs[0]), (new_args, new_kwargs))
                self._record(new_args, layer, "forward", "input", call)
                for name, value in new_kwargs.items():
                    self._record(value, layer, "forward", "input", call, name)
            else:  # PyTorch wraps a single returned value in a tuple
                new = args if result is None else (result if isinstance(result, tuple) else (result,))
                self._note_reshape(layer, args, new)
                self._record(new, layer, "forward", "input", call)
            return result
        return on_pre

    def _note_reshape(self, layer: str, given: Any, new: Any) -> None:
        before, after = _shapes_of(given), _shapes_of(new)
        if before != after:
            self._reshaped = (f"{self.spec.fn} changed the input of '{layer or '(model)'}' from {_shapes(before)} "
                              f"to {_shapes(after)}")

    def _forward_hook(self, layer: str):
        def on_forward(module, args, *rest):  # rest: (output,) or (kwargs, output)
            started = self._start((self.name, layer), args, rest[-1])
            if started is None:
                return None
            call, meta = started
            result = self._call(meta, module, args, *rest)
            if result is not None:
                self._require_shapes(layer, "output", rest[-1], result)
            self._record(rest[-1] if result is None else result, layer, "forward", "output", call)
            return result
        return on_forward

    def _require_shapes(self, layer: str, kind: str, given: Any, result: Any, prefix: str = "") -> None:
        """One line naming the entry and the layer when ``fn`` gave a tensor other shapes than PyTorch gave
        it: the next module, or autograd, would fail on them with an error that names neither (also in
        the meta-device rehearsal, before the run)."""
        before, after = _shapes_of(given, prefix), _shapes_of(result, prefix)
        if before != after:
            raise ConfigError(f"{self.key}: {self.spec.fn} changed the {kind} of '{layer or '(model)'}' from "
                              f"{_shapes(before)} to {_shapes(after)}; a {self.spec.hook} hook must keep the "
                              f"shapes PyTorch gives it")

    def _backward_hook(self, layer: str):
        def on_backward(module, grad_input, grad_output):
            started = self._start((self.name, layer), grad_input, grad_output)
            if started is None:
                return None
            call, meta = started
            result = self._call(meta, module, grad_input, grad_output)
            if result is not None:
                self._require_shapes(layer, "grad_input", grad_input, result)
            self._record(grad_output, layer, "backward", "grad_output", call)
            self._record(grad_input if result is None else result, layer, "backward", "grad_input", call)
            return result
        return on_backward

    def _backward_pre_hook(self, layer: str):
        def on_backward_pre(module, grad_output):
            started = self._start((self.name, layer), grad_output)
            if started is None:
                return None
            call, meta = started
            result = self._call(meta, module, grad_output)
            if result is not None:
                self._require_shapes(layer, "grad_output", grad_output, result)
            self._record(grad_output if result is None else result, layer, "backward", "grad_output", call)
            return result
        return on_backward_pre

    def _output_tensor_hook(self, layer: str):
        def on_forward(module, args, output):
            started = self._start((self.name, layer), output)
            if started is None:
                return None
            call, meta = started
            for slot, t in walk(output):
                if t.requires_grad:
                    t.register_hook(self._grad_hook(layer, "grad_output", slot, call, meta))
            return None
        return on_forward

    def _grad_hook(self, layer: str, kind: str, slot: str, call: int, meta: bool):
        def on_grad(grad: torch.Tensor):
            return self._grad_replaced(grad, self._call(meta, grad), layer, kind, call, slot)
        return on_grad

    def _grad_replaced(self, grad: torch.Tensor, result: Any, layer: str, kind: str, call: int, slot: str) -> Any:
        """What a tensor hook's ``fn`` returned for ``grad``, checked to keep its shape, and recorded."""
        if result is not None:
            self._require_shapes(layer, kind, grad, result, slot)
        self._record(grad if result is None else result, layer, "backward", kind, call, slot)
        return result

    def _param_grad_hook(self, layer: str, pname: str):
        def on_grad(grad: torch.Tensor):
            started = self._start((self.name, layer, pname), grad)
            if started is None:
                return None
            call, meta = started
            return self._grad_replaced(grad, self._call(meta, grad), layer, "param_grad", call, pname)
        return on_grad

    def _accumulated_hook(self, layer: str, pname: str):
        def on_accumulated(p: torch.Tensor):
            started = self._start((self.name, layer, pname), p)
            if started is None or started[1]:
                return None  # on meta: PyTorch ignores what fn returns, so there is nothing to rehearse
            call, _ = started
            result = self.fn(p)
            if p.grad is not None:
                self._record(p.grad, layer, "backward", "param_grad", call, pname)
            return result
        return on_accumulated


def _shapes_of(obj: Any, prefix: str = "") -> list[tuple[str, list[int]]]:
    return [(slot, list(t.shape)) for slot, t in walk(obj, prefix)]


def _shapes(shapes: list[tuple[str, list[int]]]) -> str:
    return ", ".join(f"{slot}: {shape}" for slot, shape in shapes) or "no tensor"
