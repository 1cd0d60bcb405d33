"""The base of every hook type: a typed parameter schema and an ``attach`` method."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from omegaconf import MISSING
from torch import nn

from hooks.select import select_modules

if TYPE_CHECKING:
    from hooks.session import HookSession


@dataclass
class HookSpec:
    """Keys every hook entry has. Subclasses add their own typed keys.

    ``layers`` is a selector (see ``hooks.select``): a string or a list of strings.
    """

    type: str = MISSING
    layers: Any = MISSING

    def check(self, key: str) -> None:
        """Reject values that are well-typed but meaningless; ``key`` is the entry's config path."""


class HookType:
    """One configured hook entry, built by the registry from a validated ``HookSpec``.

    Subclasses set ``spec_class`` and implement ``attach``; ``needs_backward`` tells the runner
    that the entry records or changes gradients, so a forward-only run rejects it up front.
    """

    spec_class: ClassVar[type[HookSpec]] = HookSpec
    type_name: ClassVar[str] = ""

    def __init__(self, name: str, spec: HookSpec) -> None:
        self.name = name
        self.spec = spec
        self.key = f"hooks.{name}"

    @property
    def needs_backward(self) -> bool:
        return False

    @property
    def compile_problem(self) -> str | None:
        """Why this entry cannot run under ``compile=true``, or ``None`` when it can.

        Refused by default when the entry needs backward: tensor and module backward hooks on
        activations break the compiled graph or are silently ignored (pytorch#117265). Hook
        types that were checked under compilation override this.
        """
        return "hooks the backward pass" if self.needs_backward else None
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

    def after_backward(self, recorder: Any) -> None:
        """Record what is known only after backward; most hook types have nothing to add."""

    def close(self) -> None:
        """Release what ``attach`` holds besides handles (the session calls it on exit)."""
