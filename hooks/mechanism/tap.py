"""The engine behind every module-level hook type: one forward pre-hook and one forward hook.

A ``Tap`` sees each call of a selected module at four points and, at each, records the tensors
of the kinds its entry asks for and optionally replaces them:

==============  =========================================================================
``input``       forward pre-hook (``with_kwargs=True``): before forward, so a module that
                changes its input in place cannot rewrite what was recorded
``output``      forward hook
``grad_output`` ``Tensor.register_hook`` on each output the caller gets (after every forward hook)
``grad_input``  a tensor hook on a ``view_as`` of each grad-requiring input (a copy for a module
                with ``inplace=True``), so the hook sees this module's share of the input
                gradient only
==============  =========================================================================

The two gradient kinds go through the module's ``hooks.mechanism.junction.Junction``: one view and one
tensor hook per input and output, shared by every entry on the module, calling the entries in
PyTorch's order (global, then ``prepend``, then config order), each on what the previous returned.
A hook PyTorch drops (a view changed in place before use) fails the step in ``after_backward``.

Gradients are taken with tensor hooks rather than ``register_full_backward_hook`` because full
backward hooks raise on every module whose output is later modified in place (most of a
torchvision ResNet: ``ReLU(inplace=True)``, ``out += identity``). A tensor hook registered before
the in-place op stays bound to the value the module produced (PyTorch autograd notes,
"Behavior of Tensor hooks when Tensor is modified in-place").

``scope: global`` registers the same callbacks with ``register_module_forward_pre_hook`` /
``register_module_forward_hook`` instead, so modules created inside ``forward`` are seen too.

Observers return ``None`` from every callback: they cannot change a result. Edits are checked:
a replacement with another shape or dtype is an error naming the entry and the layer.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from common.errors import ConfigError, choice_error
from hooks.mechanism import junction as junctions
from hooks.kernels import tensor_kinds
from hooks.mechanism.base import HookType
from hooks.specs.index import Index, narrowed, parse_index
from hooks.mechanism.junction import Junction, existing_junction, junction_for
from hooks.mechanism.recorder import replace_slot, walk
from hooks.specs.tap import TapSpec

Edit = Callable[[torch.Tensor], torch.Tensor]


class HookReturnError(ConfigError):
    """A hook produced a tensor that cannot replace the original (shape or dtype differ)."""


def apply_edit(edit, old: torch.Tensor, where: str, *args) -> torch.Tensor:
    """``edit(old, *args)``, on a tensor of any kind (``hooks.kernels.tensor_kinds.edited``), if it can stand in for
    ``old``; otherwise a ``HookReturnError`` naming ``where``. The check is written here, not called: a
    gradient edit runs it once per parameter and step."""
    new = tensor_kinds.edited(edit, old, where, *args)
    if not isinstance(new, torch.Tensor):
        raise HookReturnError(f"{where}: returned {type(new).__name__}, expected a tensor")
    if new.shape != old.shape or new.dtype != old.dtype:
        raise HookReturnError(f"{where}: returned {_dtype(new)} {list(new.shape)} in place of "
                              f"{_dtype(old)} {list(old.shape)}")
    return new


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class Tap(HookType):
    """Base of module-level hook types; a family says what to record and what to change.

    What a family may override (the public extension points; everything with a leading
    underscore is the engine's own):

    * ``record_kinds``: the kinds to record (subset of ``KINDS``);
    * ``edit_input`` / ``edit_output`` / ``edit_grad_input`` / ``edit_grad_output``: return an
      ``Edit`` (``edit_output``'s also receives the call's ``args``) or ``None`` to observe only;
    * ``edited_input``: which input (position or keyword name) ``edit_input`` changes;
    * ``grad_slot``: the one tensor whose gradient the gradient edits change (default: every one);
    * ``keep``: keep a copy of every recorded tensor (``capture``);
    * ``on_record``: called for every recorded tensor (``print`` prints here);
    * ``on_grad_edit``: called with a gradient and what the gradient edit made of it (``clamp``
      records what it removed there);
    * ``wants_forward_hook`` and ``on_forward``: a forward hook on every call even when no kind
      needs one, and what to do in it (``node`` registers its Node hooks there);
    * ``on_pre``: called in the forward pre-hook of every call, before input edits (``ablate``
      with ``target: input`` learns there which layer it is editing);
    * ``expected_kinds``: what ``HookSession.silent`` checks (``node`` records its own kinds);
    * ``attach`` and ``after_backward`` (``HookType``'s), calling ``super()`` for what the Tap
      does there (``clamp`` with ``target: params`` hooks parameters instead).
    """

    spec_class = TapSpec
    keep = False
    #: The output slot the output edit is changing, set before each call of the edit (``patch`` and
    #: ``ablate`` look their stored values up by it).
    edited_slot = "0"

    @functools.cached_property
    def index(self) -> Index | None:
        """The entry's parsed ``index`` (``None``: edits change whole tensors), parsed once."""
        return parse_index(getattr(self.spec, "index", None), f"{self.key}.index")
    _junctions: dict[int, Junction] = {}  # per module id, once attached
    _global_junction: Junction | None = None  # a global ``**`` entry's, for modules created inside forward

    record_kinds: frozenset[str] = frozenset()

    def edit_input(self) -> Edit | None:
        return None

    def edit_output(self) -> Callable[[torch.Tensor, tuple], torch.Tensor] | None:
        return None

    def edit_grad_input(self) -> Edit | None:
        return None

    def edit_grad_output(self) -> Edit | None:
        return None

    #: ``(key, slot)``: the input ``edit_input`` changes (a position or a keyword name), and the spec key
    #: naming it, for the one-line error when a call has no tensor there.
    edited_input: tuple[str, str] = ("slot", "0")

    #: The slot whose gradient the gradient edits change; ``None``: every tensor's.
    grad_slot: str | None = None

    def on_record(self, layer: str, kind: str, slot: str, tensor: torch.Tensor) -> None:
        """Called for every recorded tensor (``print`` prints here)."""

    def on_grad_edit(self, layer: str, slot: str, call: int, grad: torch.Tensor, new: torch.Tensor) -> None:
        """Called after each gradient edit with the gradient and what the edit returned."""

    #: Register the forward hook even when no kind or edit needs it (for ``on_forward``).
    wants_forward_hook = False

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        """Called in the forward hook of every call, before output edits; ``output`` is ``None``
        when forward raised (``always_call``)."""

    def on_pre(self, layer: str, call: int) -> None:
        """Called in the forward pre-hook of every call (when there is one), before input edits."""

    @property
    def needs_backward(self) -> bool:
        return bool({"grad_input", "grad_output"} & self.record_kinds) or bool(
            self.edit_grad_input() or self.edit_grad_output())

    @property
    def compile_problem(self) -> str | None:
        # Measured on torch 2.14: a tensor hook on an activation breaks the compiled graph on every call.
        if self.needs_backward:
            kinds = sorted({"grad_input", "grad_output"} & self.record_kinds) or ["edits"]
            return f"hooks activation gradients ({', '.join(kinds)}) through tensor hooks"
        if self.spec.scope == "global":
            return "uses global module hooks (scope=global), which were not checked under compilation"
        return None

    # -- registration ----------------------------------------------------------------------
    def _points(self) -> tuple[bool, bool, bool, bool]:
        """Which callbacks are needed: (pre-hook, forward hook, grad_input, grad_output)."""
        kinds = self.record_kinds
        grad_in = "grad_input" in kinds or self.edit_grad_input() is not None
        grad_out = "grad_output" in kinds or self.edit_grad_output() is not None
        wants_pre = "input" in kinds or grad_in or self.edit_input() is not None
        wants_fwd = ("output" in kinds or grad_out or self.edit_output() is not None
                     or self.wants_forward_hook)
        return wants_pre, wants_fwd, grad_in, grad_out

    @property
    def pytorch_hooks(self) -> str:
        wants_pre, wants_fwd, grad_in, grad_out = self._points()
        prefix = "register_module_" if self.spec.scope == "global" else "register_"
        names = [f"{prefix}forward_pre_hook"] * wants_pre + [f"{prefix}forward_hook"] * wants_fwd
        if grad_in:
            names.append("Tensor.register_hook on a shared view_as(input) (a copy for inplace modules)")
        if grad_out:
            names.append("Tensor.register_hook on output (shared)")
        return " + ".join(names)

    @property
    def expected_kinds(self) -> set[str]:
        """The kinds every matched call should record: those recorded or changed."""
        edits = {"input": self.edit_input(), "output": self.edit_output(),
                 "grad_input": self.edit_grad_input(), "grad_output": self.edit_grad_output()}
        return set(self.record_kinds) | {kind for kind, edit in edits.items() if edit is not None}

    def attach(self, model: nn.Module, session) -> None:
        self._start(session)
        self._open: dict[str, list[int]] = {}
        # Resolved once here, not per call: the callbacks below run for every module call.
        self._kinds = frozenset(self.record_kinds)
        self._edits = {kind: narrowed(edit, self.index) for kind, edit in (
            ("input", self.edit_input()), ("output", self.edit_output()),
            ("grad_input", self.edit_grad_input()), ("grad_output", self.edit_grad_output()))}
        wants_pre, wants_fwd, self._grad_in, self._grad_out = self._points()
        targets = self.targets(model)
        if self.spec.scope == "global":
            self._attach_global(model, targets, session, wants_pre, wants_fwd)
        else:
            for layer, module in targets:
                if wants_pre:
                    session.add(module.register_forward_pre_hook(
                        self._pre_hook(layer, wants_fwd), with_kwargs=True, prepend=self.spec.prepend))
                if wants_fwd:
                    session.add(module.register_forward_hook(
                        self._forward_hook(layer, wants_pre), prepend=self.spec.prepend,
                        always_call=self.spec.always_call))
        self._join_junctions(targets, session)

    def _join_junctions(self, targets, session) -> None:
        """Share each module's gradient taps, or keep an existing junction after our new hooks."""
        is_global = self.spec.scope == "global"
        self._junctions = {}
        self._global_junction = None  # where a module without a junction of its own is served: global ``**`` only
        if not (self._grad_in or self._grad_out):
            for junction in [existing_junction(m) for _, m in targets] + [existing_junction(None)] * is_global:
                if junction is not None:
                    junction.move_last()
            return
        edits = self._edits["grad_input"] is not None or self._edits["grad_output"] is not None
        for layer, module in targets:
            junction = junction_for(module)
            session.add(junction.join(self, is_global=is_global, prepend=self.spec.prepend, layer=layer,
                                      edits=edits, taps_inputs=self._grad_in))
            self._junctions[id(module)] = junction
        if is_global and self.spec.layers == "**":  # modules created inside forward
            self._global_junction = junction_for(None)
            session.add(self._global_junction.join(self, is_global=True, prepend=False, taps_inputs=self._grad_in))

    def after_backward(self, recorder) -> None:
        """Fail with one line if PyTorch dropped a gradient hook of this step (``hooks.mechanism.junction.check``)."""
        junctions.check(self._junctions.values())
        if self.spec.scope == "global" and existing_junction(None) is not None:
            junctions.check([existing_junction(None)])

    def _attach_global(self, model, targets, session, wants_pre: bool, wants_fwd: bool) -> None:
        names = {id(m): n for n, m in targets}
        everything = self.spec.layers == "**"
        all_ids = {id(m) for m in model.modules()}

        def name_of(module: nn.Module) -> str | None:
            name = names.get(id(module))
            if name is None and everything and id(module) not in all_ids:
                name = f"<{type(module).__name__}>"
            return name

        if wants_pre:
            def on_pre(module, args):
                layer = name_of(module)
                if layer is not None:
                    return self._pre(layer, module, args, None, wants_fwd)
            session.add(nn_module.register_module_forward_pre_hook(on_pre))
        if wants_fwd:
            def on_fwd(module, args, output):
                layer = name_of(module)
                if layer is not None:
                    return self._forward(layer, module, args, output, wants_pre)
            session.add(nn_module.register_module_forward_hook(on_fwd, always_call=self.spec.always_call))

    # -- callbacks ----------------------------------------------------------------------
    def _pre_hook(self, layer: str, pairs_with_forward: bool):
        """``_pre`` bound to ``layer``: a partial, so PyTorch calls ``_pre`` with no wrapper call in between."""
        return functools.partial(self._pre, layer, pairs_with_forward=pairs_with_forward)

    def _forward_hook(self, layer: str, paired: bool):
        """``_forward`` bound to ``layer`` (a partial, as ``_pre_hook``)."""
        return functools.partial(self._forward, layer, paired=paired)

    def _pre(self, layer: str, module, args: tuple, kwargs: dict | None, pairs_with_forward: bool):
        call = self._recorder.next_call((self.name, layer))
        if pairs_with_forward:
            self._open.setdefault(layer, []).append(call)
        if self._grad_in:
            self._junctions.get(id(module), self._global_junction).expect(
                module, layer, "grad_input", self, functools.partial(self._grad_hook, layer, call=call))
        if self._calls_on_pre:
            self.on_pre(layer, call)
        edit, kinds = self._edits["input"], self._kinds
        grad_slot = self.grad_slot if self._edits["grad_input"] is not None else None
        if edit is None and "input" not in kinds and grad_slot is None:
            return None
        items = [(str(i), a) for i, a in enumerate(args)] + list((kwargs or {}).items())
        tensors = [slot for slot, value in items if isinstance(value, torch.Tensor)]
        if grad_slot is not None:
            self._require_slot(layer, "input", "slot", grad_slot, tensors)
        key, wanted = self.edited_input if edit is not None else ("slot", None)
        if wanted is not None:
            self._require_slot(layer, "input", key, wanted, tensors)
        new_args, new_kwargs, changed = list(args), dict(kwargs or {}), False
        for slot, value in items:
            if not isinstance(value, torch.Tensor):
                if "input" in kinds:
                    for sub, t in walk(value, slot):
                        self._put(t, layer=layer, phase="forward", kind="input", slot=sub, call=call)
                continue
            edits_here = slot == wanted
            if edits_here:
                value = apply_edit(edit, value, f"{self.key} on '{layer}' input {slot}")
                changed = True
                if slot.isdigit():
                    new_args[int(slot)] = value
                else:
                    new_kwargs[slot] = value
            if "input" in kinds or edits_here:
                self._put(value, layer=layer, phase="forward", kind="input", slot=slot, call=call)
        if not changed:
            return None
        return (tuple(new_args), new_kwargs) if kwargs is not None else tuple(new_args)

    def _forward(self, layer: str, module, args: tuple, output: Any, paired: bool):
        if paired and self._open.get(layer):
            call = self._open[layer].pop()
        else:
            call = self._recorder.next_call((self.name, layer))
        if self._calls_on_forward:
            self.on_forward(layer, call, args, output)
        edit = self._edits["output"]
        new_output = None
        if edit is not None and output is not None:
            self.edited_slot = slot = self._output_slot(layer, output)
            whole = isinstance(output, torch.Tensor)
            old = output if whole else dict(walk(output))[slot]
            new = apply_edit(edit, old, f"{self.key} on '{layer}' output" + ("" if whole else f" {slot}"), args)
            output = new_output = replace_slot(output, slot, new)
            if dict(walk(output)).get(slot) is not new:  # a container replace_slot cannot rebuild: never a silent no-op
                raise ConfigError(f"{self.key}: cannot put the changed tensor back into the "
                                  f"{type(output).__name__} '{layer or '(model)'}' returns (slot {slot})")
        if "output" in self._kinds or edit is not None:
            for slot, t in (("0", output),) if isinstance(output, torch.Tensor) else walk(output):  # a bare tensor: no walk
                self._put(t, layer=layer, phase="forward", kind="output", slot=slot, call=call)
        if self._grad_out and output is not None:
            if self.grad_slot is not None and self._edits["grad_output"] is not None:
                self._require_slot(layer, "output", "slot", self.grad_slot, [slot for slot, _ in walk(output)])
            seen = output if self.spec.scope == "global" else None
            self._junctions.get(id(module), self._global_junction).expect(
                module, layer, "grad_output", self, functools.partial(self._grad_hook, layer, call=call), seen)
        return new_output

    def _output_slot(self, layer: str, output: Any) -> str:
        """The slot of ``output`` the output edit changes: ``slot``, or the only tensor there is."""
        slots = [slot for slot, _ in walk(output)]
        wanted = getattr(self.spec, "slot", None)
        if wanted is not None:
            self._require_slot(layer, "output", "slot", str(wanted), slots)
            return str(wanted)
        name, kind = layer or "(model)", type(output).__name__
        if len(slots) == 1:
            return slots[0]
        raise ConfigError(f"{self.key}: '{name}' returns a {kind} with tensors at {', '.join(slots) or 'no slot'}, "
                          f"and '{self.spec.type}' changes one of them: set {self.key}.slot")

    def _require_slot(self, layer: str, where: str, key: str, wanted: str, slots: list[str]) -> None:
        """One line when the slot an edit names holds no tensor in this call: never an edit that does nothing."""
        if wanted not in slots:
            raise choice_error(f"{self.key}.{key}", wanted, slots, f"{where} slot of '{layer or '(model)'}'")

    def _grad_hook(self, layer: str, kind: str, slot: str, call: int):
        """What this entry does with a gradient of this call: the junction asks it per kind and slot
        (through the call's wish, ``functools.partial(_grad_hook, layer, call=call)``)."""
        edit = self._edits[kind] if self.grad_slot in (None, slot) else None
        if edit is None:  # record only: the recorder is the tensor hook (it returns None: the gradient unchanged)
            return functools.partial(self._put, layer=layer, phase="backward", kind=kind, slot=slot,
                                     call=call) if kind in self._kinds else None
        where = f"{self.key} on '{layer}' {kind} {slot}"

        def on_grad(grad: torch.Tensor) -> Optional[torch.Tensor]:
            new = apply_edit(edit, grad, where)
            self.on_grad_edit(layer, slot, call, grad, new)
            self._put(new, layer=layer, phase="backward", kind=kind, slot=slot, call=call)
            return new

        return on_grad

    def _start(self, session) -> None:
        """Bind, once per attach, what the callbacks would otherwise look up per tensor: the recorder
        (``record`` itself when ``on_record`` does nothing) and which of the family's per-call
        extension points it overrides (an empty one is not called)."""
        self._recorder = session.recorder
        self._put = self._record if self._overrides("on_record") else functools.partial(
            session.recorder.record, hook=self.name, keep=self.keep)
        self._calls_on_pre = self._overrides("on_pre")
        self._calls_on_forward = self._overrides("on_forward")

    def _overrides(self, name: str) -> bool:
        """Whether this family overrides the ``Tap`` method ``name`` (an empty default is not called per call)."""
        return getattr(type(self), name) is not getattr(Tap, name)

    def _record(self, t: torch.Tensor, layer: str, phase: str, kind: str, slot: str, call: int) -> None:
        self._recorder.record(t, hook=self.name, layer=layer, phase=phase, kind=kind, slot=slot,
                              call=call, keep=self.keep)
        self.on_record(layer, kind, slot, t)
