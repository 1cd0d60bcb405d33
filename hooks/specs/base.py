"""What every hook entry has (``HookSpec``), the registry of hook types (``HOOK_TYPES``), and the
finiteness check every spec gets."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from omegaconf import MISSING

from common.errors import ConfigError
from common.registry import Registry

#: Every hook type by its ``type`` name: declared here (``HOOK_TYPES.declare("clamp", "hooks.types.gradients",
#: ClampSpec)``) or registered by a user's module (``hooks.mechanism.registry.register``); each type's spec is stored
#: in Hydra's ConfigStore as ``hook_schema/TYPE`` (with ``type`` filled in) for presets to inherit.
HOOK_TYPES = Registry("hooks.NAME.type", "hook type", "hook_schema", name_field="type")


@dataclass
class HookSpec:
    """Keys every hook entry has. Subclasses add their own typed keys.

    ``layers`` is a selector (see ``hooks.mechanism.select``): a string or a list of strings.

    A lifetime, for any entry (``HookSession`` applies it): ``steps: [from, to]`` attaches the
    entry's hooks when step ``from`` begins and removes them when step ``to`` begins (steps
    count from 0; ``to`` is excluded, as in ``range``; ``to: null`` keeps them to the end).
    ``max_calls: N`` removes them once the entry has made N calls (as counted in ``call``:
    one per module call, or per parameter gradient for parameter hooks), after the backward of
    the step that made the N-th call (in a forward-only run, when the next step begins). Calls
    after the N-th within that step still act and are recorded (``lifetimes()`` counts them),
    except for ``custom`` entries, whose function is called exactly N times.

    Numeric keys refuse NaN and ±Inf (``hooks.mechanism.registry``) unless named in ``nonfinite_ok``.
    """

    type: str = MISSING
    layers: Any = MISSING
    steps: Optional[list[Optional[int]]] = None
    max_calls: Optional[int] = None

    #: Float keys of this spec that accept NaN or ±Inf (their docstring says what it means).
    nonfinite_ok: ClassVar[tuple[str, ...]] = ()

    def check(self, key: str) -> None:
        """Reject values that are well-typed but meaningless; ``key`` is the entry's config path."""

    def check_lifetime(self, key: str) -> None:
        """Reject a ``steps`` that is not ``[from, to]`` with 0 <= from < to, or a ``max_calls`` below 1."""
        if self.steps is not None:
            ok = len(self.steps) == 2 and isinstance(self.steps[0], int) and self.steps[0] >= 0 and (
                self.steps[1] is None or self.steps[1] > self.steps[0])
            if not ok:
                raise ConfigError(f"{key}.steps: {list(self.steps)} is not [from, to] with 0 <= from < to "
                                  f"(to excluded; null = to the end), e.g. {key}.steps=[2,5]")
        if self.max_calls is not None and self.max_calls < 1:
            raise ConfigError(f"{key}.max_calls: {self.max_calls} must be at least 1 (null: no limit)")

    def first_step(self) -> int:
        """The step at which the entry's hooks are attached."""
        return self.steps[0] if self.steps else 0

    def ended(self, step: int, calls: int) -> bool:
        """Whether the lifetime is over at ``step`` after ``calls`` calls."""
        end = self.steps[1] if self.steps else None
        return (end is not None and step >= end) or (self.max_calls is not None and calls >= self.max_calls)
def check_finite(key: str, spec: Any) -> None:
    """Refuse NaN and ±Inf in every float key of ``spec`` (also inside lists), unless the spec
    names the key in ``nonfinite_ok``: a NaN factor or value would poison every result after it."""
    allowed = getattr(spec, "nonfinite_ok", ())
    for f in dataclasses.fields(spec):
        if f.name in allowed:
            continue
        value = getattr(spec, f.name)
        for i, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, float) and not math.isfinite(item):
                where = f"{key}.{f.name}" + (f"[{i}]" if isinstance(value, (list, tuple)) else "")
                raise ConfigError(f"{where}: {item} is not a finite number; hook parameters must be finite")
