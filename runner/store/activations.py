"""Reading activation stores back (written by ``hooks.store`` through ``hooks.shards``).

``ActivationStore(path)`` is a map-style ``Dataset`` over a complete store, ``ShuffledStore`` an
``IterableDataset`` that reads whole shards in a seeded random order, for probe and SAE training.

Why ``.npy`` shards: ``np.load(mmap_mode="r")`` reads any row of a shard without reading the rest
(what a map-style reader needs) and without a new dependency; writing one is the raw bytes after
a 128-byte header. Measured once on this shared machine (indicative only: 8 shards of 16 MiB,
best of 3, while other jobs ran): writes raw 114, npy 158, safetensors 291 (no fsync), parquet
20 MiB/s; full reads into torch raw 332, npy 177, parquet 58 MiB/s (safetensors maps lazily: not
comparable). Parquet's list columns cost a conversion each way; safetensors adds a dependency
and a JSON header per file for one tensor a file. ``benchmarks/units.py`` measures the ratios.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from common.ranks import part_rank
from hooks.store_files import DTYPES, read_store_manifest, shard_name


def store_parts(path: Path) -> list[tuple[Path, dict]]:
    """The complete store at ``path`` as ``(directory, manifest)`` pairs: itself, or the ``rank-N``
    parts the ranks of a run under ``torch.distributed`` wrote (every one of them, each complete)."""
    manifest = read_store_manifest(path)
    parts = [] if manifest is not None else sorted(p for p in path.glob("rank-*") if part_rank(p) is not None)
    found = [(part, read_store_manifest(part)) for part in parts] or [(path, manifest)]
    for part, manifest in found:
        if manifest is None or not manifest["complete"]:
            raise FileNotFoundError(f"no complete activation store at '{part}' (its pass has not finished)")
    worlds = sorted({manifest.get("world_size", 1) for _, manifest in found})
    ranks = sorted(manifest.get("rank", 0) for _, manifest in found)
    if parts and ranks != list(range(worlds[-1])):
        raise FileNotFoundError(f"the store at '{path}' has the parts of ranks {ranks} of a run on "
                                f"{worlds[-1]} ranks: not every rank's part is there")
    return found


class ActivationStore(Dataset):
    """Complete stores as one map-style ``Dataset``: ``store[i]`` is ``(activation, sample_id)`` of row ``i``.

    ``paths``: one store, or the stores of a sharded sweep's jobs (``data.shard``), read as one in
    the order of their first sample id; a store written under ``torch.distributed`` is read with
    its ranks' parts (``path/rank-N``) in the same order. Shards are memory-mapped
    (``np.load(mmap_mode="r")``): a row costs a read of its bytes only.

    Example:
        >>> store = ActivationStore("stores/crops/layer3")
        >>> x, sample = store[0]
    """

    def __init__(self, *paths: str | Path) -> None:
        if not paths:
            raise ValueError("ActivationStore: give the directory of at least one store")
        found = [part for path in paths for part in store_parts(Path(path))]
        layouts = {(m["layer"], m["dtype"], tuple(m["item_shape"] or ())) for _, m in found}
        if len(layouts) > 1:
            raise ValueError(f"the stores hold different things (layer, dtype, item shape): {sorted(layouts)}")
        found.sort(key=lambda pm: pm[1]["shards"][0]["first"] if pm[1]["shards"] else -1)
        self.manifest = found[0][1]
        self.dtype = DTYPES[self.manifest["dtype"]]
        #: every shard of every store, in order: (store directory, shard index)
        self.files = [(path, s["index"]) for path, manifest in found for s in manifest["shards"]]
        self.rows = [s["rows"] for _, manifest in found for s in manifest["shards"]]
        self.starts = np.cumsum([0] + self.rows)
        self._maps: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard ``index`` (of all the stores' shards) as activations and sample ids, memory-mapped."""
        if index not in self._maps:
            path, number = self.files[index]
            self._maps[index] = (np.load(path / shard_name("shard", number), mmap_mode="r"),
                                 np.load(path / shard_name("samples", number), mmap_mode="r"))
        return self._maps[index]

    def tensor(self, values: np.ndarray) -> torch.Tensor:
        """Rows of a shard as a torch tensor of the store's dtype (a copy: the map is read-only)."""
        out = torch.from_numpy(np.array(values))
        return out.view(torch.bfloat16) if self.dtype == torch.bfloat16 else out

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a store of {len(self)}")
        i %= len(self)
        index = int(np.searchsorted(self.starts, i, side="right") - 1)
        values, samples = self.shard(index)
        row = i - int(self.starts[index])
        return self.tensor(values[row]), int(samples[row])


class ShuffledStore(IterableDataset):
    """Every row of the stores at ``paths`` once per epoch, shuffled across shards from ``seed`` (and the epoch).

    Reads ``shards_at_once`` shards (chosen at random) into memory at a time and yields their rows
    in random order: memory stays at that many shards, reads are whole shards (disk speed).
    ``set_epoch(n)`` draws another order, as ``DistributedSampler`` does.
    """

    def __init__(self, *paths: str | Path, seed: int = 0, shards_at_once: int = 2) -> None:
        self.store = ActivationStore(*paths)
        self.seed, self.epoch, self.shards_at_once = seed, 0, max(1, shards_at_once)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.store)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.store.rows), generator=gen).tolist()
        for first in range(0, len(order), self.shards_at_once):
            group = order[first:first + self.shards_at_once]
            values = torch.cat([self.store.tensor(self.store.shard(i)[0]) for i in group])
            samples = torch.cat([torch.from_numpy(np.array(self.store.shard(i)[1])) for i in group])
            for row in torch.randperm(len(samples), generator=gen).tolist():
                yield values[row], int(samples[row])
