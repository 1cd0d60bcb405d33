"""Which rank this process is, and how a rank's part of a run or store is named (``rank-N``).

Under ``torch.distributed`` every rank writes its own part: ``OUT/rank-N`` of a run
(``runner.store.ranks``) and ``PATH/LAYER/rank-N`` of an activation store (``hooks.store``);
readers find the parts by these names.
"""
from __future__ import annotations

import re
from pathlib import Path

_PART = re.compile(r"rank-(\d+)")
#: The key of a rank's part manifest naming the rows every rank records alike, which a reader counts
#: once: ``true`` (all of them: every rank ran the whole batch) or a list of ``[hook, layer, phase,
#: kind, slot]`` (rows of a ``DTensor``, each the whole tensor's, ``hooks.shards``).
SAME_ON_EVERY_RANK = "same_on_every_rank"


def process_group() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialized, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def part_name(rank: int) -> str:
    return f"rank-{rank}"


def part_rank(path: Path) -> int | None:
    """The rank whose part ``path`` is (``.../rank-3`` -> 3), or ``None`` when it is no rank's part."""
    found = _PART.fullmatch(Path(path).name)
    return int(found.group(1)) if found else None
