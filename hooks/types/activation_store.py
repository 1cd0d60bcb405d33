"""``store``: the selected layers' outputs over a whole-dataset pass, written to activation stores.

A forward hook on each selected module hands every call's output (``slot``) with the batch's
sample ids to a ``hooks.formats.store_files.ShardWriter`` at ``path/LAYER``: fixed-size safetensors shards
of ``shard_size`` samples in ``dtype``, listed in ``store.json`` once whole (the layout:
``common.store_format``). Memory: one shard per layer. Sample ids (``hooks.types.samples``, the
dataset indices of a whole-dataset pass; a training stream's shuffled ones are refused at its first
batch, one line) are kept beside the rows; a pass over a store a killed pass left writes on from its first incomplete
shard, and the runner's pass skips the batches the complete shards hold (``samples_held``).
Under ``torch.distributed`` each rank writes its own part, ``path/LAYER/rank-N`` (its samples:
the ranks take contiguous parts of the data), and the readers read the parts as one. Read back
with ``runner.store.activations.ActivationStore`` or ``ShuffledStore``.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from common.errors import ConfigError
from common.ranks import part_name, process_group
from common.store_format import store_header
from hooks.mechanism.registry import register
from hooks.types.samples import SampleOutputs
from hooks.formats.store_files import ShardWriter, stored_through
from hooks.specs.activation_store import StoreSpec


@register("store")
class Store(SampleOutputs):
    """Writes each selected layer's outputs, per sample, to its activation store; changes nothing."""

    spec_class = StoreSpec

    def __init__(self, name: str, spec: StoreSpec) -> None:
        super().__init__(name, spec)
        self.writers: dict[str, ShardWriter] = {}

    eval_problem = "stores the run's own pass; eval passes would add other samples"

    def samples_held(self, model: nn.Module, start: int) -> int:
        """The samples from ``start`` on that every selected layer's store holds in complete shards."""
        header = {layer: store_header(layer, self.spec.shard_size, self.spec.dtype, process_group())
                  for layer, _ in self.targets(model)}
        held = [stored_through(self.store_dir(layer), h) + 1 - start for layer, h in header.items()]
        return max(0, min(held, default=0))

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        if layer not in self.writers:
            if len(samples) > 1 and not bool((samples[1:] - samples[:-1] == 1).all()):
                shown = ", ".join(map(str, samples[:5].tolist()))
                raise ConfigError(f"{self.key}: the data give their samples shuffled (ids {shown}, ...: a training "
                                  f"stream), and a store keeps a contiguous part of the data in order under each "
                                  f"sample's own id; add mode=eval for a pass over the dataset in order")
            self.writers[layer] = ShardWriter(self.store_dir(layer), layer, self.spec.shard_size, self.spec.dtype,
                                              process_group())
        self.writers[layer].add(x, samples)

    def store_dir(self, layer: str) -> Path:
        """Where ``layer``'s store is written: ``path/LAYER``, or this rank's part of it under ``torch.distributed``."""
        group = process_group()
        return Path(self.spec.path) / layer / (part_name(group[0]) if group else "")

    def held_bytes(self) -> dict[str, int]:
        """Each layer's shard buffer: ``shard_size`` rows in ``dtype``, with an int64 sample id each
        (``ShardWriter.add`` copies every batch into it)."""
        itemsize = getattr(torch, self.spec.dtype).itemsize
        total = sum(self.spec.shard_size * (math.prod(shapes[0][1:]) * itemsize + 8) for shapes in self.planned.values())
        return {"shard buffers": total} if total else {}

    def tables(self) -> dict[str, dict[str, list]]:
        """At the end of the run: the last shard of each store, which is then complete."""
        self.report_unseen(set(self.writers))
        for writer in self.writers.values():
            writer.finish()
        return {}
