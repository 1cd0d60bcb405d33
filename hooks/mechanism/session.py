"""``HookSession``: the one owner of every handle a run registers, removed on exit whatever happens."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from hooks.kernels import stats
from hooks.mechanism.recorder import Recorder

if TYPE_CHECKING:
    from hooks.mechanism.base import HookType

FORWARD_KINDS = frozenset({"input", "output", "saved"})


class LostRowsWarning(UserWarning):
    """Rows an entry would record that the loop made impossible to record (said once they are lost)."""


class Silence(NamedTuple):
    """An entry that matched ``layer`` but recorded nothing of ``kind``, and the likely reason."""

    key: str
    layer: str
    kind: str
    reason: str


class HookSession:
    """Attach built hook types to a model for the span of a ``with`` block.

    Handles are removed in reverse order of registration on exit, also when the forward pass,
    the backward pass or a hook raises, or on Ctrl-C, so the model leaves the block with exactly
    the hooks it had before. Tensor hooks that hooks register on activations during forward need
    no handle: they die with the autograd graph of that step.

    Each entry's handles are kept apart, so that its lifetime (``steps``, ``max_calls``, see
    ``hooks.mechanism.base.HookSpec``) can end on its own: ``begin_step(step)``, which the run loop calls
    before each step, attaches entries whose first step it is and removes those whose lifetime
    is over; ``after_backward`` removes those that reached ``max_calls`` (not earlier: what an
    entry packed in forward, e.g. ``offload_disk`` files, must outlive backward). With
    ``lifetimes=False`` (plan, rehearsal) every entry is attached at once and stays.

    What exists only after backward (accumulated ``.grad``) is recorded whoever calls
    ``backward``: a post-accumulate-grad hook on each trainable parameter marks that gradients
    landed, and ``flush()`` records them before anything can change them: before any optimizer
    steps (a global optimizer step pre-hook, so after DDP's averaging and a framework's
    clipping), or when the loop ends the step and calls it. Those hooks are registered only while
    an attached entry acts after backward (``HookType.acts_after_backward``): a session of
    forward-only entries, or of none, adds no call per parameter to a step. A loop that drops the gradients
    before that (``model.zero_grad()`` with no optimizer) leaves them recorded as they landed: the
    same hook keeps a reference to the ``.grad`` of each parameter an entry reads after backward
    (``HookType.grads_after_backward``; no copy, and nothing at all when no entry reads one), and
    ``landed_grad`` hands it out where ``.grad`` is gone. A ``.grad`` freed inside backward, before
    that hook ran (an optimizer in backward: ``post_accumulate`` with ``op: sgd``), cannot be
    recorded after it: one warning names the entry and the parameters. A backward that reaches no
    trainable parameter marks nothing: call ``backward(loss)`` there.

    Example:
        >>> with HookSession(model, build_hooks(cfg.hooks)) as session:
        ...     session.begin_step(0)
        ...     session.backward(model(x).sum())
        ...     captures = session.recorder.drain()
    """

    def __init__(self, model: nn.Module, hooks: Sequence[HookType], recorder: Recorder | None = None,
                 lifetimes: bool = True) -> None:
        self.model = model
        self.hooks = list(hooks)
        self.recorder = recorder or Recorder()
        self.use_lifetimes = lifetimes
        self._handles: list[tuple[str | None, RemovableHandle]] = []
        self._owner: str | None = None       # the entry whose ``attach`` is running
        self._attached: list[HookType] = []  # in config order
        self._step = 0
        self._attached_at: dict[str, int] = {}
        self._removed_at: dict[str, int] = {}
        self._grads_landed = False
        self._reads_grad: set[int] = set()  # ids of the parameters whose .grad an attached entry reads after backward
        self._landed: dict[int, torch.Tensor | None] = {}  # their .grad as the last backward left it
        self._marking: list[RemovableHandle] = []  # the hooks marking that a backward landed gradients

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        """Take ownership of ``handle``; it is removed when the session closes or its entry's lifetime ends."""
        self._handles.append((self._owner, handle))
        return handle

    def __enter__(self) -> HookSession:
        try:
            self._attach([h for h in self.hooks if not self.use_lifetimes or h.spec.first_step() == 0])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every handle, newest first, then let each hook release what else it holds."""
        self._watch_gradients(False)
        while self._handles:
            self._handles.pop()[1].remove()
        for hook in reversed(self._attached):
            hook.close()
        self._attached = []
        self._landed.clear()

    @property
    def step(self) -> int:
        """The step ``begin_step`` last began (0 before any): ``patch`` takes that step's source values."""
        return self._step

    # -- lifetimes ----------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Apply lifetimes before ``step`` runs: remove entries whose lifetime is over, attach
        entries whose first step it is (all attached entries are then registered again in config
        order, so that entries fire in config order whenever they were attached)."""
        self._step = step
        self.check_lifetimes()
        if not self.use_lifetimes:
            return
        starting = [h for h in self.hooks if h not in self._attached and h.name not in self._removed_at
                    and h.spec.first_step() <= step and not self._over(h)]
        if starting:
            keep = [h for h in self.hooks if h in self._attached or h in starting]
            self._detach(list(self._attached))
            self._attach(keep)

    def check_lifetimes(self) -> None:
        """Remove the handles of every attached entry whose lifetime is over (between passes only)."""
        if not self.use_lifetimes:
            return
        ended = [h for h in self._attached if self._over(h)]
        if ended:
            self._detach(ended)
            for hook in ended:
                self._removed_at.setdefault(hook.name, self._step)

    def lifetimes(self) -> dict[str, dict]:
        """Per entry key: the step its hooks were attached at and removed at (``None``: not
        attached yet / still attached) and the calls it made, for the run's manifest."""
        calls = self._calls()
        return {h.key: {"attached_at_step": self._attached_at.get(h.name),
                        "removed_at_step": self._removed_at.get(h.name),
                        "calls": calls.get(h.name, 0)} for h in self.hooks}

    def run_state(self) -> dict:
        """Where the entries' lifetimes stand (calls counted, steps attached and removed, each
        entry's own counts), for a resume point: a resumed run ends lifetimes where they would have."""
        return {"calls": self.recorder.call_counts(), "attached_at": dict(self._attached_at),
                "removed_at": dict(self._removed_at), "hooks": {h.name: h.run_state() for h in self.hooks}}

    def restore_run_state(self, state: dict) -> None:
        """Go on from ``run_state()``; call before the first resumed ``begin_step``."""
        self.recorder.restore_call_counts(state["calls"])
        self._attached_at.update(state["attached_at"])
        self._removed_at.update(state["removed_at"])
        for hook in self.hooks:
            hook.restore_run_state(state["hooks"].get(hook.name, {}))

    def _over(self, hook: HookType) -> bool:
        return hook.spec.ended(self._step, self._calls().get(hook.name, 0))

    def _calls(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, n in self.recorder.call_counts().items():
            out[key[0]] = out.get(key[0], 0) + n
        return out

    def _attach(self, hooks: list[HookType]) -> None:
        for hook in hooks:
            self._owner = hook.name
            try:
                hook.attach(self.model, self)
            finally:
                self._owner = None
            self._attached.append(hook)
            self._attached_at.setdefault(hook.name, self._step)
        self._watch_reads()

    def _detach(self, hooks: list[HookType]) -> None:
        names = {h.name for h in hooks}
        for owner, handle in reversed(self._handles):
            if owner in names:
                handle.remove()
        self._handles = [(o, h) for o, h in self._handles if o not in names]
        for hook in reversed(hooks):
            hook.close()
        self._attached = [h for h in self._attached if h.name not in names]
        self._watch_reads()

    def _watch_reads(self) -> None:
        self._reads_grad = {id(p) for hook in self._attached for p in hook.grads_after_backward()}
        self._watch_gradients(any(hook.acts_after_backward for hook in self._attached))

    # -- passes -------------------------------------------------------------------------------
    def _watch_gradients(self, on: bool) -> None:
        """Know when a backward pass wrote ``.grad`` (``flush`` records it then), whoever called it
        (``on``), or stop watching (no attached entry acts after backward)."""
        if not on:
            while self._marking:
                self._marking.pop().remove()
        if not on or self._marking:
            return

        def landed(param: torch.Tensor) -> None:
            self._grads_landed = True
            if id(param) in self._reads_grad:
                self._landed[id(param)] = param.grad

        self._marking = [param.register_post_accumulate_grad_hook(landed)
                         for param in self.model.parameters() if param.requires_grad]
        self._marking.append(register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: self.flush()))

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward(**kwargs)`` with the recorder told that backward runs (a forward call
        inside it is activation checkpointing's recompute), then ``after_backward``."""
        with self.recorder.backward_pass():
            loss.backward(**kwargs)
        self.after_backward()

    def flush(self) -> None:
        """``after_backward`` if a backward wrote gradients since it last ran."""
        if self._grads_landed:
            self.after_backward()

    def landed_grad(self, param: torch.Tensor) -> torch.Tensor | None:
        """``param.grad``, or where the loop has dropped it since the last backward (``zero_grad()``
        before the step ends), the ``.grad`` that backward left (for entries' ``after_backward``)."""
        return param.grad if param.grad is not None else self._landed.get(id(param))

    def after_backward(self) -> None:
        """Let each hook record what exists only once backward is done (accumulated ``.grad``),
        then remove entries that reached ``max_calls``."""
        self._grads_landed = False
        for hook in self._attached:
            hook.after_backward(self.recorder)
        self._say_freed()
        self._landed.clear()
        self.check_lifetimes()

    def _say_freed(self) -> None:
        """Warn, per entry, of the parameters whose ``.grad`` was freed inside backward: their rows are lost."""
        freed = {pid for pid, grad in self._landed.items() if grad is None}
        if not freed:
            return
        names = {id(p): name for name, p in self.model.named_parameters()}
        for hook in self._attached:
            gone = [names[id(p)] for p in hook.grads_after_backward() if id(p) in freed]
            if gone:
                warnings.warn(f"{hook.key} recorded no after_backward row of {', '.join(gone)}: its .grad was freed "
                              f"inside backward (an optimizer in backward, e.g. post_accumulate with op=sgd)",
                              LostRowsWarning, stacklevel=2)

    # -- silent entries -------------------------------------------------------------------------
    def silent(self) -> list[Silence]:
        """Entries that matched modules but recorded nothing of a kind they record (an edit
        records what it produced, so an edit that never ran is here too), one per matched layer,
        with the likely reason. Meant for after the first step; entries not attached yet are
        left out, and a kind that some matched layer recorded is not reported."""
        tally = self.recorder.tally(by_layer=True)
        calls = self.recorder.call_counts()
        called = {(k[0], k[1]) for k in calls if len(k) > 1}
        out = []
        for hook in self.hooks:
            if hook.name not in self._attached_at:
                continue
            kinds = [k for k in sorted(hook.expected_kinds)
                     if not any(key[0] == hook.name and key[2] == k for key in tally)]
            if not kinds:
                continue
            for layer, module in hook.targets(self.model):
                for kind in kinds:
                    out.append(Silence(hook.key, layer, kind, _reason(kind, module, (hook.name, layer) in called)))
        return out


def _reason(kind: str, module: nn.Module, called: bool) -> str:
    """The likely reason why ``module`` gave no ``kind``."""
    params = list(module.parameters())
    frozen = bool(params) and not any(p.requires_grad for p in params)
    if not called and kind in FORWARD_KINDS:
        return "module never called (forward did not reach it)"
    if kind not in FORWARD_KINDS and frozen:
        return "frozen parameters (requires_grad=False) and no input needing grad: no gradient reached it"
    if not called:
        return ("its hooks never ran: module never called, no gradient reached it, or its output is not a "
                "tensor or tuple of tensors (e.g. a dict output), which PyTorch's module backward hooks do not see")
    if kind in ("input", "output"):
        return f"its {kind} holds no tensor"
    if kind == "saved":
        return "autograd saved nothing while it ran (nothing in it needs grad)"
    return ("no gradient reached it: its output holds no tensor the loss depends on, or one that "
            "PyTorch's module backward hooks do not see (e.g. a dict output)")


def prepare_recording(device: torch.device, sizes: dict | None, any_hooks: bool) -> None:
    """Build the statistics kernel before step 0 when the run will use it on ``device``.

    The first captured tensor would otherwise pay for the build (the C kernel on CPU, the first
    time on a machine; ``torch.compile`` on CUDA) inside step 0, and step 0's ``wall_time_s``
    would report it as the hooks' cost. ``sizes``: the rehearsal's ``(count, bytes, kept)`` per
    entry and kind (``None``: not rehearsed); off CPU only tensors large enough use the kernel.
    """
    large = sizes is None or any(nbytes >= count * stats.COMPILE_MIN_NUMEL * 2
                                 for count, nbytes, _ in sizes.values() if count)
    if any_hooks and (device.type == "cpu" or large):
        stats.prepare(device)
