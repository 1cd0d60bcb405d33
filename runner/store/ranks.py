"""Runs under ``torch.distributed``: each rank writes its own part, rank 0 commits the run over them.

Rank N records into ``OUT/rank-N`` (a complete run directory of its own, committed as any run,
its manifest saying ``rank`` and ``world_size``). When every rank has committed its part (a
barrier), rank 0 checks each part's manifest and commits ``OUT/manifest.json`` with ``ranks``
(``{"0": "rank-0", ...}``) and no data file of its own; a second barrier lets no rank return
before that manifest is there. Readers find the run by that manifest only: a ``rank-N``
directory is a part, never a run of a sweep, so a run whose ranks did not all finish is not read.
On an exception a rank leaves without waiting (its part is not committed; the launcher ends the
others).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from common.errors import ConfigError
from common.ranks import part_name, process_group
from runner.store.claim import claim_run_dir
from common.manifest import read_manifest
from common.records import CONFIG
from runner.store.commit import commit, stage_config
from runner.store.errors import OutputError


@contextlib.contextmanager
def rank_part(out_dir: Path, overwrite: bool, config_yaml: str) -> Iterator[tuple[Path, dict]]:
    """The directory this process writes to and its manifest's extra fields; after the block, under
    ``torch.distributed``, the run over every rank's part is committed (see the module doc)."""
    group = process_group()
    if group is None:
        yield out_dir, {}
        return
    import torch.distributed as dist

    rank, world = group
    claim, refused = None, [None]
    if rank == 0:
        try:
            claim = claim_run_dir(out_dir, overwrite)
        except (ConfigError, OutputError) as exc:
            refused = [exc]
    dist.broadcast_object_list(refused, src=0)  # every rank fails as rank 0 does, in one line
    if refused[0] is not None:
        raise refused[0]
    try:
        yield out_dir / part_name(rank), {"rank": rank, "world_size": world}
        dist.barrier()  # every rank's part is committed
        if claim is not None:
            _commit_parts(out_dir, world, claim.run_id, config_yaml)
        dist.barrier()  # the run's manifest is there for every rank
    finally:
        if claim is not None:
            claim.release()


def _commit_parts(out_dir: Path, world: int, run_id: str, config_yaml: str) -> None:
    """Rank 0: the run's manifest over ``world`` committed parts, with the config they were made with."""
    parts = {str(rank): part_name(rank) for rank in range(world)}
    manifests = {rank: read_manifest(out_dir / part) for rank, part in parts.items()}
    missing = [parts[rank] for rank, m in manifests.items() if not m or m.get("rank") != int(rank)]
    if missing:
        raise OutputError(0, f"cannot commit '{out_dir}': no committed part in {missing}")
    first = manifests["0"]
    manifest = {key: value for key, value in first.items() if key not in ("rank", "lifetimes", "replaced")}
    manifest.update(run_id=run_id, files={}, ranks=parts,
                    finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    commit(out_dir, {CONFIG: stage_config(out_dir, config_yaml)}, manifest)
