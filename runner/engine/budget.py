"""``memory.budget``: the host memory a plan's entries will hold, stated by ``plan=true`` and bounded before the run.

What an entry holds comes from the plan's rehearsal on the meta device (shapes, no data): the
tensors it keeps of one step (``capture``, ``extract``: detached copies in their dtype, held until
the step's captures are written), and what it holds across steps (``HookType.held_bytes``:
``units``' statistics, a ``store``'s shard buffers, an ``sae``'s weights). All of it is on the host (``cpu``): kept
tensors are copied off an accelerator, statistics and stores are kept on the CPU; under torchrun
each rank holds its own. With ``memory.budget=2GiB`` a plan that holds more is refused in one
line naming the entries, before anything runs (``runner.attach(..., memory={"budget": "2GiB"})``:
at the model's first call, from its rehearsal there, before that call computes anything). The
output files' own buffers are ``output.row_group_mb`` each, apart from this.
"""
from __future__ import annotations

import re

from common.errors import ConfigError

#: Where every byte stated here is held (see the module doc).
DEVICE = "cpu"
KEPT = "kept tensors of one step"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([a-z]*)", re.I)


def parse_size(text: object, key: str) -> int:
    """Bytes of ``text`` such as ``2GiB``, ``512MiB``, ``1.5GB`` or ``1000000``; else the one-line error."""
    found = _SIZE.fullmatch(str(text).strip())
    if found is None or found.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key}: {text!r} is not a size; give bytes with a unit, e.g. {key}=2GiB "
                          f"(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def held(found) -> list[tuple[str, str, int]]:
    """``(entry, what holds it, bytes)`` for each thing the rehearsal ``found`` says an entry holds on the host."""
    kept: dict[str, int] = {}
    for (key, _kind), (_n, nbytes, kept_bytes) in found.records.items():
        if kept_bytes:
            kept[key] = kept.get(key, 0) + nbytes
    rows = [(key, KEPT, nbytes) for key, nbytes in kept.items()]
    rows += [(key, what, nbytes) for key, parts in found.held.items() for what, nbytes in parts.items()]
    return sorted(rows)


#: The remedies' settings as the command line writes them (``runner.engine.python_errors`` has a caller's keywords).
COMMAND_LINE = {"batch": "sample.batch=N", "budget": "memory.budget"}


class OverBudget(ConfigError):
    """A plan whose entries hold more than the budget; ``line(words)`` says it with the remedies' settings in
    ``words`` (``COMMAND_LINE``'s keys), and ``str()`` as the command line does."""

    def __init__(self, rows: list[tuple[str, str, int]], limit: int) -> None:
        self.rows, self.limit = rows, limit
        super().__init__(self.line(COMMAND_LINE))

    def line(self, words: dict[str, str]) -> str:
        total = sum(nbytes for _, _, nbytes in self.rows)
        parts = ", ".join(f"hooks.{key} {size_text(nbytes)} of {what}" for key, what, nbytes in self.rows)
        return (f"memory.budget: the entries hold {size_text(total)} on {DEVICE} ({parts}), over the budget of "
                f"{size_text(self.limit)}; select fewer layers, record fewer samples ({words['batch']}), lower a "
                f"store's shard_size, or raise {words['budget']}")


def check_budget(budget: str | None, found, unplanned: str = "the model cannot run on the meta device") -> None:
    """Refuse, in one line, a plan whose entries hold more than ``budget`` (``memory.budget``); ``found``
    is the rehearsal (``None``: there was none, for the reason ``unplanned``).

    Raises:
        OverBudget: the entries hold more than ``budget``.
        ConfigError: ``budget`` is set and there was no rehearsal to plan from.
    """
    if budget is None:
        return
    limit = parse_size(budget, "memory.budget")
    if found is None:
        raise ConfigError(f"memory.budget: {unplanned}, so what its entries hold cannot be planned; "
                          f"run without memory.budget")
    rows = held(found)
    if sum(nbytes for _, _, nbytes in rows) > limit:
        raise OverBudget(rows, limit)
