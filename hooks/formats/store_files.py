"""Writing activation stores: one layer's per-sample outputs in fixed-size safetensors shards.

The layout (file names, tensors, ``store.json``) is ``common.store_format``'s. A shard is written
whole (``common.durable.replaced``: a temporary name, fsync, rename) and only then listed in
``store.json`` (itself replaced by rename), so the manifest names complete shards only: a pass
killed by a signal leaves at most an unlisted temporary file (removed by the next writer), and
the next pass over the same store keeps the listed shards and writes on from the first
incomplete one; a file of a shard not listed is never read, and is written anew. Memory: one
shard's buffer (safetensors writes it from the buffer itself). Reading back:
``runner.store.activations``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from common.durable import TMP_MARK, replaced
from common.store_format import (ACTIVATIONS, DTYPES, MANIFEST, SAMPLES, read_store_manifest, shard_name,
                                 store_header)


def stored_through(path: Path, header: dict) -> int:
    """The last sample id in the complete shards of the store at ``path`` (-1: none, or a store of another header)."""
    found = read_store_manifest(path)
    if found is None or not found["shards"] or {k: found.get(k) for k in header} != header:
        return -1
    return int(found["shards"][-1]["last"])


class ShardWriter:
    """Streams one layer's per-sample activations into a store; resumes a store a killed pass left.

    ``add(x, samples)`` takes a batch of consecutive sample ids; rows whose ids the listed shards already
    hold are skipped, so a resumed pass starts writing at the first incomplete shard (the
    runner's pass does not run the model on the stored items: ``Store.samples_held``).
    ``finish()`` writes the last (possibly smaller) shard and marks the store complete.
    ``rank``: ``(rank, world_size)`` of the part this writer writes under ``torch.distributed``,
    kept in its manifest so that a reader knows whether every rank's part is there.
    """

    def __init__(self, path: Path, layer: str, shard_size: int, dtype: str,
                 rank: tuple[int, int] | None = None) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"store '{path}': dtype '{dtype}', a store keeps one of {', '.join(DTYPES)}")
        self.path, self.shard_size, self.dtype = Path(path), shard_size, getattr(torch, dtype)
        self.header = store_header(layer, shard_size, dtype, rank)
        self.path.mkdir(parents=True, exist_ok=True)
        found = read_store_manifest(self.path)
        if found is not None and {k: found.get(k) for k in self.header} != self.header:
            raise ValueError(f"store '{self.path}' holds {({k: found.get(k) for k in self.header})}, not "
                             f"{self.header}; use another store path or delete it")
        self.manifest = found or {**self.header, "item_shape": None, "shards": [], "complete": False}
        for left in self.path.glob(f".*{TMP_MARK}*"):  # what a killed writer was writing (a store has one writer)
            left.unlink(missing_ok=True)
        shards = self.manifest["shards"]
        self.last = shards[-1]["last"] if shards else -1  #: the last sample id taken (listed or buffered)
        self._rows: torch.Tensor | None = None  # the shard being filled: one buffer, reused for every shard
        self._ids = torch.empty(shard_size, dtype=torch.int64)
        self._filled = 0

    @property
    def complete(self) -> bool:
        return bool(self.manifest["complete"])

    def add(self, x: torch.Tensor, samples: torch.Tensor) -> None:
        keep = samples > self.last
        if self.complete or not bool(keep.any()):
            return
        x, ids = x.detach(), samples.to(torch.int64).cpu()
        if not bool(keep.all()):
            x, ids = x[keep], ids[keep.cpu()]
        first = int(ids[0])
        if self.last >= 0 and first != self.last + 1:  # never a store with a hole in it
            self._refuse(f"samples {self.last + 1}..{first - 1} never came")
        if len(ids) > 1 and not bool((ids[1:] - ids[:-1] == 1).all()):  # nor one within a batch, from the first
            self._refuse(f"a batch holds samples {_listed(ids)}, not consecutive ones")
        shape = list(x.shape[1:])
        if self.manifest["item_shape"] not in (None, shape):
            raise ValueError(f"store '{self.path}': items of shape {shape}, the store holds {self.manifest['item_shape']}")
        self.manifest["item_shape"] = shape
        if self._rows is None:
            self._rows = torch.empty(self.shard_size, *shape, dtype=self.dtype)
        self.last = int(ids[-1])
        taken = 0
        while taken < len(ids):  # copied (and converted) straight into the shard's buffer: no other copy
            n = min(len(ids) - taken, self.shard_size - self._filled)
            self._rows[self._filled:self._filled + n].copy_(x[taken:taken + n])
            self._ids[self._filled:self._filled + n] = ids[taken:taken + n]
            self._filled, taken = self._filled + n, taken + n
            if self._filled == self.shard_size:
                self._write_shard()

    def _refuse(self, what: str) -> None:
        raise ValueError(f"store '{self.path}': {what}; a store takes a contiguous part of the data in order "
                         f"(under torch.distributed: each rank its own range, not every world_size-th sample, "
                         f"as a DistributedSampler deals them); run the pass again from its start, the complete "
                         f"shards stay")

    def finish(self) -> None:
        """Write the buffered rows as the last shard and mark the store complete."""
        if self._filled:
            self._write_shard()
        self.manifest["complete"] = True
        self._write_manifest()

    def _write_shard(self) -> None:
        """The buffer's rows as the next shard: its file whole under its name, then listed in the
        manifest; one fsync of the directory after the manifest's rename makes both renames durable."""
        rows, index = self._filled, len(self.manifest["shards"])
        ids = self._ids[:rows]
        with replaced(self.path / shard_name(index), sync_directory=False) as tmp:
            save_file({ACTIVATIONS: self._rows[:rows], SAMPLES: ids}, tmp)
        self.manifest["shards"].append({"index": index, "file": shard_name(index), "rows": rows,
                                        "first": int(ids[0]), "last": int(ids[-1])})
        self._filled = 0
        self._write_manifest()

    def _write_manifest(self) -> None:
        with replaced(self.path / MANIFEST) as tmp:
            tmp.write_text(json.dumps(self.manifest, indent=1) + "\n")


def _listed(ids: torch.Tensor) -> str:
    shown = ", ".join(str(i) for i in ids[:5].tolist())
    return f"{shown}, ..." if len(ids) > 5 else shown
