"""The base of every hook type: an ``attach`` method over a typed spec (``hooks.specs``: ``HookSpec``)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from hooks.mechanism.select import select_modules
from hooks.specs.base import HookSpec

if TYPE_CHECKING:
    from hooks.mechanism.session import HookSession


class HookType:
    """One configured hook entry, built by the registry from a validated ``HookSpec``.

    Subclasses set ``spec_class`` and implement ``attach``; ``needs_backward`` tells the runner
    that the entry records or changes gradients, so a forward-only run rejects it up front.

    The spec is what the config said, checked, and never changes; everything an entry learns
    while attached (stored values, generators, counts) is state, and each attach (the
    rehearsal, the run, a resumed run) gets it fresh: ``fresh()``.

    An entry declares what it needs from the loop around it, and the runner supplies it without
    knowing the type (as zennit's composites supply what each rule asks for): ``keep`` (its
    records keep their values, which pictures are drawn from), ``side_data`` and ``side_mode``
    (a pass on other data beside each step, which the runner's loop runs), ``side_metric`` and
    ``side_backward`` (the gradient of a metric in the corrupted pass beside it), ``stored_runs`` (the
    run directories it reads), ``own_loop_problem`` (why a user's own loop cannot serve it).
    """

    spec_class: ClassVar[type[HookSpec]] = HookSpec
    type_name: ClassVar[str] = ""
    #: Whether every tensor this entry records keeps its values (``tensors.parquet``), not only statistics.
    keep: ClassVar[bool] = False
    #: The run-total files this entry's ``tables()`` fills (``common.records.RUN_TOTAL_SCHEMAS``), which
    #: pictures drawn from them look for.
    writes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, name: str, spec: HookSpec) -> None:
        self.name = name
        self.spec = spec
        self.key = f"hooks.{name}"

    def check_spec(self) -> None:
        """Refuse, before the run, what the spec says but only the hook's side can check (a stored run's
        files: ``ablate``'s ``reference``); ``build_hook`` calls it after the spec's own ``check``."""

    @classmethod
    def check_with(cls, hooks: list[HookType]) -> None:
        """Refuse, before the run, what entries of this type cannot do beside the run's other entries
        ``hooks`` (``sae``: an entry selecting its features listed before it); nothing by default."""

    def fresh(self) -> HookType:
        """The same entry (name and spec) with none of the state an attach gave this one."""
        return type(self)(self.name, self.spec)

    #: Whether this entry needs the clean pass of the passes beside each step (``side_mode("capture")``);
    #: an entry that compares the step with its own batch unchanged (``steer``) needs only the second
    #: (``side_mode("off")``), and the runner skips the first when no entry needs it.
    side_clean: ClassVar[bool] = True

    #: Data keys, over the run's ``data``, of a batch to run beside each step (``patch`` with
    #: ``source: clean``), or ``None``: the runner's loop runs that batch with the entry in
    #: ``side_mode("capture")``, then the step's batch in ``side_mode("off")``
    #: (``runner.engine.side_by_side``), before the step proper.
    side_data: ClassVar[dict | None] = None

    @contextlib.contextmanager
    def side_mode(self, mode: str) -> Iterator[None]:
        """What the entry does in a pass beside the step (see ``side_data``); nothing by default."""
        yield

    #: The step metric (``logit``, ``logit_diff``) whose gradient this entry takes in the corrupted pass
    #: beside each step, or ``None``: with one, that pass runs with gradients and ``side_backward`` gets the
    #: metric of its output (``attribution``).
    side_metric: ClassVar[str | None] = None

    def side_backward(self, value) -> None:
        """Take what the entry needs from ``value``, the ``side_metric`` of the corrupted pass beside
        the step, a scalar tensor in that pass's graph (``torch.autograd.grad``)."""

    #: Why a user's own loop (``runner.attach``) cannot serve this entry, in one line naming its key, or
    #: ``None`` when it can.
    own_loop_problem: ClassVar[str | None] = None

    #: The stored run directories this entry reads its values from (checked before the run).
    stored_runs: ClassVar[tuple[str, ...]] = ()

    needs_backward: ClassVar[bool] = False

    def samples_held(self, model: nn.Module, start: int) -> int:
        """How many samples of a dataset pass, from sample id ``start`` on, this entry holds from an
        earlier pass and needs no more (a store's complete shards): a pass whose every entry holds
        them runs the model from after them. 0 by default: the entry needs every sample."""
        return 0

    @property
    def compile_problem(self) -> str | None:
        """Why this entry cannot run under ``compile=true``, or ``None`` when it can.

        Refused by default when the entry needs backward: tensor and module backward hooks on
        activations break the compiled graph or are silently ignored (pytorch#117265). Hook
        types that were checked under compilation override this.
        """
        return "hooks the backward pass" if self.needs_backward else None

    #: Why this entry cannot act in eval passes (``eval_every``), or ``None`` when it can.
    eval_problem: ClassVar[str | None] = None

    @property
    def pytorch_hooks(self) -> str:
        """The PyTorch hooks this entry registers, for ``plan=true``."""
        raise NotImplementedError

    def targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The modules this entry's ``layers`` selector matches in ``model``."""
        return select_modules(model, self.spec.layers, f"{self.key}.layers")

    def attach(self, model: nn.Module, session: HookSession) -> None:
        """Register this entry's PyTorch hooks on ``model``, giving every handle to ``session``."""
        raise NotImplementedError

    def explain(self, exc: BaseException) -> str | None:
        """A one-line message when ``exc`` (raised during a pass) is this entry's doing, else ``None``."""
        return None

    #: The kinds this entry records whenever its hooks act: ``HookSession.silent`` reports an entry that
    #: matched modules but recorded none of one of them. Each type says its own.
    expected_kinds: ClassVar[frozenset[str]] = frozenset()

    def check_built(self, model: nn.Module) -> None:
        """Refuse, before the run, what only the model built on the meta device can say of this entry
        when the meta device cannot run it whole (``sae``: the width of the tensor it splices); nothing
        by default."""

    def check_steps(self, steps: int) -> None:
        """Refuse, before the run, a run of ``steps`` steps this entry cannot serve (``patch``: its source's steps)."""

    def after_backward(self, recorder: Any) -> None:
        """Record what is known only after backward; most hook types have nothing to add."""

    @property
    def acts_after_backward(self) -> bool:
        """Whether the session must know when a backward lands gradients, for this entry's sake: its
        ``after_backward`` records or checks what the backward did (an entry that records or changes
        gradients: ``needs_backward``), or its ``max_calls`` lifetime ends after that backward. A type
        whose ``after_backward`` acts without ``needs_backward`` says so here. Without such an entry
        the session hooks no parameter: forward-only entries add no call per parameter to a step."""
        return self.needs_backward or self.spec.max_calls is not None

    def grads_after_backward(self) -> list[nn.Parameter]:
        """The parameters whose ``.grad`` ``after_backward`` reads, once attached (through
        ``HookSession.landed_grad``, which keeps each as it landed for a loop that drops it early)."""
        return []

    def close(self) -> None:
        """Release what ``attach`` holds besides handles (the session calls it on exit)."""

    def tables(self) -> dict[str, dict[str, list]]:
        """Rows this entry adds at the end of the run, by file name, as columns (``units``: ``units.parquet``)."""
        return {}

    def held_bytes(self) -> dict[str, int]:
        """Host bytes this entry holds beyond a step's captures, by what holds them (``units``: its
        statistics, ``store``: its shard buffers), as planned from the outputs it saw on the meta
        device; ``plan=true`` prints them and ``memory.budget`` bounds them."""
        return {}

    def run_state(self) -> dict:
        """What this entry counted over the run that a resumed run must go on from (``custom``:
        the calls handed to ``fn``); the session keeps it with the resume point."""
        return {}

    def restore_run_state(self, state: dict) -> None:
        """Go on from ``run_state()`` as a resumed run's previous part left it."""


def explanation(hooks, exc: BaseException) -> str | None:
    """The one-line message of the first entry of ``hooks`` that explains ``exc``, else ``None``."""
    return next((message for message in (hook.explain(exc) for hook in hooks) if message), None)
