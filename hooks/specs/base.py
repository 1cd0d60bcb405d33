"""What every hook entry has (``HookSpec``), the registry of hook types (``HOOK_TYPES``), what a type declares
of itself to the engine and to analysis (``Answers``, ``Section``, ``HookSpec.stored_run``), and the
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


@dataclass(frozen=True)
class Answers:
    """What analysis says of a type's entries (or of a mode's own rows, ``runner.config.schema.MODE_ANSWERS``):
    ``run`` is the ``"module:function"`` answering for one entry of a run, ``(run_dir, entry) -> Answer | None``;
    ``sweep`` the one answering for every job of a sweep at once, ``(path, entry, corrupted, on_corrupt)``
    (``runner.analysis.answers``). ``None``: the statistics the entry recorded; for a sweep, its table of jobs.

    Named, not imported: this room imports nothing of runner/, and an answerer is imported only when a run
    of its type is summarized."""

    run: Optional[str] = None
    sweep: Optional[str] = None


@dataclass(frozen=True)
class Section:
    """A section of the report (``runner.analysis.report``) on runs of a type: its HTML ``id`` and ``heading``,
    the ``"module:function"`` writing its HTML, ``(path, runs, steps, corrupted, on_corrupt) -> str | None``
    (``None``: nothing for these runs, the section is left out), and the section it follows (``after``)."""

    id: str
    heading: str
    writer: str
    after: str


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
    #: What analysis answers for an entry of this type (the engine and analysis never test a type's name: they
    #: ask its spec). A subclass inherits its parent's declarations: a subclass that is another type says its own.
    answers: ClassVar[Answers] = Answers()
    #: The report's section on this type's runs; ``None``: none of its own.
    section: ClassVar[Optional[Section]] = None
    #: The pictures (``plots=[NAME]``) drawn from this type's own files: a run with such an entry that cannot
    #: draw one says why; of a run without one, nothing is said.
    pictures: ClassVar[tuple[str, ...]] = ()
    #: Whether a live logger (``logger=...``) shows this type's statistic rows when it names no ``entries``.
    logged_live: ClassVar[bool] = False

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

    def stored_run(self) -> Optional[tuple[str, str]]:
        """The key naming a stored run this entry takes a value of every call from, and that run's directory;
        ``None``: it takes none (``mode=generate`` checks such a run generated as many tokens as it will)."""
        return None

    def without_side_pass(self, key: str) -> str:
        """What to change so that this entry (``key``) asks for no pass beside each step (``mode=generate``
        runs none)."""
        return "drop the entry"

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
