"""Reading activation stores back (written by the ``store`` hook type through ``hooks.formats.store_files``).

``ActivationStore(path)`` is a map-style ``Dataset`` over a complete store, ``ShuffledStore`` an
``IterableDataset`` that reads whole shards in a seeded random order, for probe and SAE training.
The layout is ``common.store_format``'s; shards are read with safetensors' own library, which
gives each tensor the dtype and shape its file header says (bfloat16 included): ``safe_open``
maps a shard, so a row costs a read of its own bytes only, and ``load_file`` reads a whole one.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.utils.data import Dataset, IterableDataset

from common.ranks import part_rank
from common.store_format import ACTIVATIONS, SAMPLES, read_store_manifest


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
    its ranks' parts (``path/rank-N``) in the same order. Shards are memory-mapped (``safe_open``):
    a row costs a read of its bytes only.

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
        #: every shard file of every store, in order
        self.files = [path / s["file"] for path, manifest in found for s in manifest["shards"]]
        self.rows = [s["rows"] for _, manifest in found for s in manifest["shards"]]
        self.starts = np.cumsum([0] + self.rows)
        self._maps: dict[int, tuple] = {}  # shard -> its mapped activations and its sample ids

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Shard ``index`` (of all the stores' shards) read whole: its activations and sample ids."""
        tensors = load_file(self.files[index])
        return tensors[ACTIVATIONS], tensors[SAMPLES]

    def _mapped(self, index: int) -> tuple:
        """Shard ``index``'s activations, mapped (rows read when indexed), and its sample ids."""
        if index not in self._maps:
            with safe_open(self.files[index], framework="pt") as f:
                self._maps[index] = (f.get_slice(ACTIVATIONS), f.get_tensor(SAMPLES))
        return self._maps[index]

    def __getstate__(self) -> dict:
        """For a ``DataLoader``'s worker processes: a mapped shard is not picklable; each worker maps its own."""
        return {**self.__dict__, "_maps": {}}

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a store of {len(self)}")
        i %= len(self)
        index = int(np.searchsorted(self.starts, i, side="right") - 1)
        values, samples = self._mapped(index)
        row = i - int(self.starts[index])
        return values[row].clone(), int(samples[row])  # a copy of the row: the map is the file's


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
            shards = [self.store.shard(i) for i in group]
            values = torch.cat([values for values, _ in shards])
            samples = torch.cat([samples for _, samples in shards])
            for row in torch.randperm(len(samples), generator=gen).tolist():
                yield values[row], int(samples[row])
