"""Which rank this process is, and how a rank's part of a run or store is named (``rank-N``).

Under ``torch.distributed`` every rank writes its own part: ``OUT/rank-N`` of a run
(``runner.store.ranks``) and ``PATH/LAYER/rank-N`` of an activation store (``hooks.store``);
readers find the parts by these names (``rank_files``: a run's file, its own or its ranks' parts).
"""
from __future__ import annotations

import re
from pathlib import Path

from common.manifest import read_manifest

_PART = re.compile(r"rank-(\d+)")
#: The key of a rank's part manifest naming the rows every rank records alike, which a reader counts
#: once: ``true`` (all of them: every rank ran the whole batch) or a list of ``[hook, layer, phase,
#: kind, slot]`` (rows of a ``DTensor``, each the whole tensor's, ``hooks.mechanism.shards``).
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


def is_part(run_dir: Path) -> bool:
    """Whether ``run_dir`` is one rank's part of a distributed run (not a run of its own)."""
    return part_rank(run_dir) is not None


def rank_files(run_dir: Path, name: str) -> list[tuple[int, Path]]:
    """The file ``name`` of a run as ``(rank, path)`` pairs: its own (rank 0, or the rank of a part
    read on its own), or those of its ranks' parts."""
    if (run_dir / name).is_file():
        return [(part_rank(run_dir) or 0, run_dir / name)]
    ranks = (read_manifest(run_dir) or {}).get("ranks", {})
    found = [(int(rank), run_dir / part / name) for rank, part in ranks.items()]
    return sorted((rank, path) for rank, path in found if path.is_file())
