"""Keys shared by the module-level hook types (``hooks.mechanism.tap``): scope, an edit's ``index`` and ``slot``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError, choice_error
from hooks.specs.base import HookSpec
from hooks.specs.index import parse_index

KINDS = ("input", "output", "grad_input", "grad_output")
SCOPES = ("module", "global")


@dataclass
class TapSpec(HookSpec):
    """Keys shared by module-level hook types.

    ``scope``: ``module`` hooks the selected modules; ``global`` uses PyTorch's global module
    hooks and sees every module call, including modules created inside ``forward`` (recorded
    under ``<ClassName>``) when ``layers`` is ``"**"``. ``prepend`` registers before the
    module's existing hooks; ``always_call`` makes the forward hook run even when forward raises.
    """

    scope: str = "module"  #: ``module`` (the selected modules' hooks) or ``global`` (PyTorch's global module hooks)
    prepend: bool = False  #: register before the module's existing hooks
    always_call: bool = False  #: the forward hook runs even when forward raises

    def check(self, key: str) -> None:
        if self.scope not in SCOPES:
            raise choice_error(f"{key}.scope", self.scope, SCOPES, "scope")
        if self.scope == "global" and self.prepend:
            raise ConfigError(f"{key}.prepend: global hooks always run before module hooks and "
                              f"PyTorch offers no prepend for them; drop prepend or use scope=module")


@dataclass
class EditSpec(TapSpec):
    """Keys of the types that change tensors: ``index`` narrows the change (``hooks.index``)."""

    index: Any = None  #: narrows the change to part of the tensor (``hooks.index``; null: all of it)

    def check(self, key: str) -> None:
        super().check(key)
        parse_index(self.index, f"{key}.index")


@dataclass
class SlotEditSpec(EditSpec):
    """Keys of the types that change one tensor of several: ``slot`` picks it where a module
    returns a tuple or mapping (``0``, ``1.0``, a key: the ``slot`` column's values; the command
    line reads ``1.0`` as a number, which names the same slot). Without it an output edit changes
    such an output's only tensor and refuses one holding several; ``ablate`` with ``target: input``
    takes the input of that position or keyword (default: the first); a gradient edit
    (``hooks.types.gradients``) changes every tensor's gradient."""

    slot: Any = None  #: which tensor of a tuple or mapping output (or input) the edit changes (null: the only one)

    def check(self, key: str) -> None:
        super().check(key)
        if self.slot is not None and (isinstance(self.slot, bool) or not isinstance(self.slot, (int, float, str))):
            raise ConfigError(f"{key}.slot: {self.slot!r} must be a slot such as 0, 1.0 or a key of the output")


def check_kinds(key: str, kinds: list[str]) -> None:
    """Reject an empty or unknown ``kinds`` list."""
    if not kinds:
        raise ConfigError(f"{key}.kinds: empty; choose from {', '.join(KINDS)}")
    for kind in kinds:
        if kind not in KINDS:
            raise choice_error(f"{key}.kinds", kind, KINDS, "kind")
