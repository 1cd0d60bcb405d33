"""One gradient tap per module input and output, shared by every ``Tap`` entry on that module.

Why shared: if each entry wrapped the input in its own ``view_as``, the last-listed view would
sit nearest the module and fire first, so entries would see ``grad_input`` in reverse config
order. A ``Junction`` instead makes one view (and one tensor hook) per input and one tensor hook
per output, and calls the entries' callbacks in PyTorch's order for module hooks: entries with
``scope: global`` first (PyTorch runs global hooks before a module's own), then ``prepend``
entries (the one attached last first), then the rest in config order. Each callback receives
what the previous one returned, as chained PyTorch hooks do.

The junction's forward pre-hook is kept after every forward pre-hook the runner registers on the
module, and its forward hook after every forward hook: the view is made of the input ``forward``
really receives, and the output hook sits on the output the caller really gets, which is where
``register_full_backward_hook`` takes ``grad_input`` and ``grad_output``.

In-place modules: PyTorch drops a tensor hook registered on a view that is then modified in
place. A module with ``inplace=True`` (``ReLU(inplace=True)`` and the like) therefore receives a
copy of each hooked input (``clone``, tracked by autograd) instead of a view: it modifies the
copy, the hook on the copy stays bound to the value before the change, and the numbers are
those of the same module with ``inplace=False``. The caller's tensor is then left unmodified (the
module's output carries the result, which is what every ``torch.nn`` in-place module returns and
what torchvision models use). Any other hook PyTorch drops (a module that changes its input in
place without an ``inplace`` attribute saying so; a module returning a view, such as ``Identity``
or a reshape, whose output the caller then changes in place) is found after backward by
``check`` and named in a one-line ``ConfigError``; the runner's meta-device rehearsal runs it
before the first step.

Entries with ``mechanism: module`` join too, without taps, so that mixing mechanisms on a module
where an entry changes gradients fails when attaching (see ``Junction.join``).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from common.errors import ConfigError
from hooks.mechanism import shards
from hooks.mechanism.recorder import walk

GradCallback = Callable[[torch.Tensor], Optional[torch.Tensor]]
#: ``(kind, slot) -> callback or None``: what one entry wants done with one gradient of one call.
Wish = Callable[[str, str], Optional[GradCallback]]


class Subscription:
    """The handle an entry gives its session; removing it leaves the lineup (and the last one
    to leave removes the lineup's PyTorch hooks)."""

    def __init__(self, lineup: Lineup, owner: Any, rank: tuple[int, int], callback: Any = None,
                 mechanism: str = "tensor", edits: bool = False, taps_inputs: bool = False) -> None:
        self.lineup, self.owner, self.rank, self.callback = lineup, owner, rank, callback
        self.mechanism, self.edits, self.taps_inputs = mechanism, edits, taps_inputs

    def remove(self) -> None:
        self.lineup.leave(self)


class Lineup:
    """Entries sharing one set of PyTorch hooks, kept in PyTorch's firing order: global entries
    first, then ``prepend`` entries (last joined first), then the others in the order they joined."""

    def __init__(self, key: Any, registry: dict) -> None:
        self.key, self.registry = key, registry
        self.members: list[Subscription] = []
        self._counter = 0
        self._handles: list = []
        self._register()

    def join(self, owner: Any, *, is_global: bool = False, prepend: bool = False,
             callback: Any = None, **traits: Any) -> Subscription:
        """Add ``owner`` in PyTorch's order; ``traits`` are the subscription's (``Junction.join``'s)."""
        self._counter += 1
        rank = (0, self._counter) if is_global else (1, -self._counter if prepend else self._counter)
        sub = Subscription(self, owner, rank, callback, **traits)
        self.members.append(sub)
        self.members.sort(key=lambda s: s.rank)
        self._joined()
        return sub

    def leave(self, sub: Subscription) -> None:
        if sub in self.members:
            self.members.remove(sub)
            self._joined()
        if not self.members:
            self._unregister()
            if self.registry.get(self.key) is self:
                del self.registry[self.key]

    def _joined(self) -> None:
        """The members changed (a lineup that precomputes from them does it here, not per call)."""

    def _register(self) -> None:
        raise NotImplementedError

    def _unregister(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class Junction(Lineup):
    """The shared gradient taps of one module (or, for ``GLOBAL``, of modules seen only by
    global hooks). Entries call ``expect`` from their own hooks for each call they want."""

    def __init__(self, site: nn.Module | None, registry: dict) -> None:
        self.site = site
        self._pending: dict[tuple[int, str], Any] = {}
        self._watched: list[tuple] = []
        self.edits = False
        super().__init__(GLOBAL if site is None else id(site), registry)

    def join(self, owner: Any, *, is_global: bool = False, prepend: bool = False,
             callback: Any = None, layer: str = "", mechanism: str = "tensor",
             edits: bool = False, taps_inputs: bool = False) -> Subscription:
        """Add ``owner`` in PyTorch's order and move the junction's hooks after everyone's.

        ``taps_inputs``: the owner will ``expect`` ``grad_input``; a module's junction registers its
        forward pre-hook only while some member does (else it would run on every call for nothing).

        Entries with ``mechanism: module`` join too, only to be checked against the others:
        PyTorch calls module backward hooks inside the tensor hooks taken around the module, so
        when one of the entries changes gradients, config order cannot hold across mechanisms.
        """
        sub = super().join(owner, is_global=is_global, prepend=prepend, mechanism=mechanism, edits=edits,
                           taps_inputs=taps_inputs)
        if len({s.mechanism for s in self.members}) > 1 and any(s.edits for s in self.members):
            super().leave(sub)
            editor = next(s for s in self.members + [sub] if s.edits)
            other = next(s for s in self.members + [sub] if s.mechanism != editor.mechanism)
            raise ConfigError(
                f"{editor.owner.key} (mechanism={editor.mechanism}) and {other.owner.key} "
                f"(mechanism={other.mechanism}) on '{layer}': PyTorch runs module backward hooks inside "
                f"the tensor hooks around the module, so these cannot fire in config order, and "
                f"{editor.owner.key} changes gradients; give both the same mechanism")
        self.move_last()
        return sub

    def leave(self, sub: Subscription) -> None:
        super().leave(sub)
        if not self.members:  # the session is closing: let go of the step's tensors
            self._watched.clear()
            self._pending.clear()
            _UNSETTLED.pop(id(self), None)
            _SUSPECT.pop(id(self), None)

    def _joined(self) -> None:
        #: whether a member changes gradients; if none does, what a callback returns is dropped (an
        #: observer's callback may be the recorder's own ``record``, which must never edit a gradient)
        self.edits = any(s.edits for s in self.members)

    def move_last(self) -> None:
        """Re-register the junction's hooks so they run after every hook registered so far."""
        self._unregister()
        self._register()

    def _register(self) -> None:
        if self.site is None:
            self._handles += [nn_module.register_module_forward_pre_hook(self._global_pre),
                              nn_module.register_module_forward_hook(self._global_forward)]
        else:
            if any(s.taps_inputs for s in self.members):
                self._handles.append(self.site.register_forward_pre_hook(self._on_pre, with_kwargs=True))
            self._handles.append(self.site.register_forward_hook(self._on_forward))

    # -- per call ------------------------------------------------------------------------
    def expect(self, module: nn.Module, layer: str, kind: str, owner: Any, wish: Wish, seen: Any = None) -> None:
        """``owner`` wants this call's gradients of ``kind`` (``grad_input``/``grad_output``);
        called from the owner's forward pre-hook or forward hook, before the junction's own.

        ``seen``: the output a ``scope: global`` entry saw. PyTorch runs every global hook before any
        module's own, so hooks outside the runner (a later global one, a module's own) may replace the
        output between that entry and this junction; its ``grad_output`` is then taken on the tensor it
        saw (and recorded as its ``output``), as a hook registered there would get it.
        """
        self._pending.setdefault((id(module), kind), {})[owner] = wish
        self._pending[(id(module), "layer")] = layer
        if seen is not None:
            self._pending.setdefault((id(module), "seen"), {})[owner] = seen

    def _take(self, module: nn.Module, kind: str) -> list[Wish]:
        wanted = self._pending.pop((id(module), kind), None)
        if not wanted:
            return []
        return [wanted[s.owner] for s in self.members if s.owner in wanted]

    def _global_pre(self, module, args):
        if id(module) not in self.registry:  # a module with its own junction is served there
            return self._on_pre(module, args, None)

    def _global_forward(self, module, args, output):
        if id(module) not in self.registry:
            return self._on_forward(module, args, output)

    def _on_pre(self, module: nn.Module, args: tuple, kwargs: dict | None):
        wishes = self._take(module, "grad_input")
        if not wishes:
            return None
        copy = getattr(module, "inplace", False) is True
        layer = self._pending.pop((id(module), "layer"), "?")
        new_args, new_kwargs, changed = list(args), dict(kwargs or {}), False
        items = [(str(i), a) for i, a in enumerate(args)] + list((kwargs or {}).items())
        for slot, value in items:
            if not isinstance(value, torch.Tensor) or not value.requires_grad:
                continue
            callbacks = [cb for cb in (w("grad_input", slot) for w in wishes) if cb is not None]
            if not callbacks:
                continue
            tapped = value.clone() if copy else value.view_as(value)
            self._tap(tapped, callbacks, layer, "grad_input", slot)
            if slot.isdigit():
                new_args[int(slot)] = tapped
            else:
                new_kwargs[slot] = tapped
            changed = True
        if not changed:
            return None
        return (tuple(new_args), new_kwargs) if kwargs is not None else tuple(new_args)

    def _on_forward(self, module: nn.Module, args: tuple, output: Any):
        wanted = self._pending.pop((id(module), "grad_output"), None)
        seen = self._pending.pop((id(module), "seen"), {})
        layer = self._pending.pop((id(module), "layer"), "?")
        if not wanted or output is None:
            return None
        final = [("0", output)] if isinstance(output, torch.Tensor) else list(walk(output))  # a bare tensor: no walk
        taps: dict[int, tuple[torch.Tensor, str, list[GradCallback]]] = {}  # by tensor, entries in PyTorch's order
        for sub in self.members:
            if sub.owner not in wanted:
                continue
            tensors = final if sub.owner not in seen else list(walk(seen[sub.owner]))
            for slot, t in tensors:
                callback = wanted[sub.owner]("grad_output", slot) if t.requires_grad else None
                if callback is not None:
                    taps.setdefault(id(t), (t, slot, []))[2].append(callback)
        for t, slot, callbacks in taps.values():
            self._tap(t, callbacks, layer, "grad_output", slot)
        return None

    # -- hooks PyTorch dropped -------------------------------------------------------------
    def _tap(self, t: torch.Tensor, callbacks: list[GradCallback], layer: str, kind: str, slot: str) -> None:
        """Hook ``t`` and watch it until ``check`` (after backward)."""
        fired = [False]
        chained = callbacks[0] if len(callbacks) == 1 else _chain(callbacks)
        edits = self.edits

        def on_grad(grad: torch.Tensor) -> Optional[torch.Tensor]:
            fired[0] = True
            if _UNSETTLED:
                settle_all()
            new = chained(grad)
            return new if edits else None

        t.register_hook(on_grad)
        self._watched.append((t, t.grad_fn, fired, layer, kind, slot))
        _UNSETTLED[id(self)] = self

    def dropped(self) -> None:
        """Raise if PyTorch dropped one of this step's hooks (``check`` has settled the junction).

        PyTorch drops a tensor hook when the tensor is a view that is modified in place (through
        itself or another view of the same data) before an operation used it: the module
        modified its input in place without an ``inplace`` attribute saying so, or the module
        returned a view (its input as-is, a reshape) that the caller then modified in place.
        Such a hook did not fire and the tensor's ``grad_fn`` changed; a hook that did not fire
        because the tensor was not on the loss path leaves ``grad_fn`` as it was.
        """
        watched, self._watched = self._watched, []
        _SUSPECT.pop(id(self), None)
        for _, _, fired, layer, kind, slot in watched:
            if not fired[0]:
                owners = ", ".join(sorted({getattr(s.owner, "key", "?") for s in self.members}))
                raise ConfigError(
                    f"{owners}: PyTorch dropped the {kind} hook of '{layer}' slot {slot}: that tensor is a "
                    f"view modified in place before use (by the module itself, or later through another "
                    f"view, e.g. Identity or a reshape followed by ReLU(inplace=True)); select another "
                    f"layer or make that operation out of place")


def settle_all() -> None:
    """Forward is over: every junction that tapped tensors since backward last began keeps only what
    ``check`` needs, and no tensor (called by the first gradient hook to fire in a backward pass, and
    by ``check``). One pass over all of them, not a call per junction: it runs once per step.

    Holding every tapped output until after backward kept each one alive past the point where
    autograd frees it (resnet18 at batch 32: 214 MB more peak memory than the same step
    without the runner, and backward then paged in fresh memory instead of reusing it). A hook
    can only have been dropped on a tensor whose ``grad_fn`` changed after it was tapped,
    which happens in forward; those are kept as flags (and their junction in ``_SUSPECT``), the
    others are forgotten.
    """
    for key, junction in _UNSETTLED.items():
        kept = []
        for t, node, fired, layer, kind, slot in junction._watched:
            if t is None or t.grad_fn is not node:
                kept.append((None, None, fired, layer, kind, slot))
        junction._watched = kept
        if kept:
            _SUSPECT[key] = junction
    _UNSETTLED.clear()


def check(junctions) -> None:
    """Raise if PyTorch dropped one of this step's hooks on ``junctions`` (``Junction.dropped``); then
    forget the step's tensors. Only a junction left with a suspect tap after ``settle_all`` is looked
    at: a step whose hooks all stayed bound makes no call per junction."""
    if _UNSETTLED:
        settle_all()
    if _SUSPECT:
        for junction in junctions:
            if id(junction) in _SUSPECT:
                junction.dropped()


def _chain(callbacks: list[GradCallback]) -> GradCallback:
    """One tensor hook calling ``callbacks`` in order, each on what the previous returned."""
    if len(callbacks) == 1:
        return callbacks[0]

    def dispatch(grad: torch.Tensor) -> Optional[torch.Tensor]:
        changed = False
        for cb in callbacks:
            new = cb(grad)
            if new is not None:
                grad, changed = new, True
        return grad if changed else None

    return dispatch


class ParamLineup(Lineup):
    """One tensor hook on a parameter calling every entry's callback in PyTorch's order.

    ``Tensor.register_hook`` has no ``prepend``; sharing one hook gives entries the order
    ``prepend`` promises among themselves without touching PyTorch's hook dict. A hook registered
    on the parameter outside the runner keeps its place relative to this one.

    A sharded parameter (a ``DTensor``: FSDP2's) never sees a tensor hook fire: FSDP2 assigns its
    reduced gradient shard to ``.grad`` itself, and calls post-accumulate-grad hooks after. Its
    lineup is such a hook, which hands the entries the reduced gradient (``DTensor``, whose
    elementwise operations act on each rank's shard) and writes what they return into ``.grad``.
    Its ``.grad`` must be new in each backward (zeroed with ``set_to_none``, PyTorch's default):
    added into the ``.grad`` of an earlier backward, the edit would act on the sum, unlike a
    tensor hook, and that is refused in one line.
    """

    def __init__(self, param: torch.Tensor, registry: dict) -> None:
        self.param = param
        self._edited = None  # a weak reference to the sharded .grad last edited
        self._dispatch: GradCallback = _chain([])  # the members' callbacks chained, rebuilt when they change
        super().__init__(("param", id(param)), registry)

    def _register(self) -> None:
        if shards.is_sharded(self.param):
            self._handles.append(self.param.register_post_accumulate_grad_hook(self._dispatch_reduced))
        else:
            self._handles.append(self.param.register_hook(self._on_grad))

    def _joined(self) -> None:
        self._dispatch = _chain([s.callback for s in self.members])

    def _on_grad(self, grad: torch.Tensor) -> Optional[torch.Tensor]:
        """The parameter's one tensor hook: whatever the members are now (they change between steps)."""
        return self._dispatch(grad)

    def _dispatch_reduced(self, param: torch.Tensor) -> None:
        grad = param.grad
        if self._edited is not None and self._edited() is grad:
            owners = ", ".join(sorted({getattr(s.owner, "key", "?") for s in self.members}))
            raise ConfigError(f"{owners}: a sharded (FSDP2) parameter's .grad was accumulated over two backward "
                              f"passes; the edit would act on their sum: zero gradients between backward passes "
                              f"(optimizer.zero_grad(set_to_none=True)) or edit in a run without accumulation")
        new = self._dispatch(grad)
        if new is not None and new is not grad:
            with torch.no_grad():
                grad.to_local().copy_(new.to_local())
        self._edited = weakref.ref(grad)


def param_lineup(param: torch.Tensor) -> ParamLineup:
    """The shared tensor hook of ``param``, created on first use."""
    key = ("param", id(param))
    lineup = _JUNCTIONS.get(key)
    if lineup is None or lineup.param is not param:
        lineup = _JUNCTIONS[key] = ParamLineup(param, _JUNCTIONS)
    return lineup


#: Registry key of the junction serving modules that only global hooks see.
GLOBAL = "global"
#: Every live junction and parameter lineup; an entry leaves when its session removes its handle.
_JUNCTIONS: dict[Any, Lineup] = {}
#: Junctions holding tapped tensors of a forward pass whose backward has not begun.
_UNSETTLED: dict[int, Junction] = {}
#: Settled junctions still watching a tap whose tensor changed in forward (``check`` looks at these only).
_SUSPECT: dict[int, Junction] = {}


def junction_for(module: nn.Module | None) -> Junction:
    """The junction of ``module`` (``None``: the global one), created on first use."""
    key = GLOBAL if module is None else id(module)
    junction = _JUNCTIONS.get(key)
    if junction is None or (module is not None and junction.site is not module):
        junction = _JUNCTIONS[key] = Junction(module, _JUNCTIONS)
    return junction


def existing_junction(module: nn.Module | None) -> Junction | None:
    """The junction of ``module`` (``None``: the global one) if some entry uses it, else ``None``."""
    junction = _JUNCTIONS.get(GLOBAL if module is None else id(module))
    return junction if isinstance(junction, Junction) and junction.site is module else None
