"""A pass over a whole dataset: ``mode=eval`` over data with a length reads its items in order.

Every item once per epoch (the held-out part included, the last batch possibly smaller), each
batch carrying its items' dataset indices (``Batch.samples``), which hook types such as
``units`` keep beside what they record. ``data.shard=i data.num_shards=N`` narrows the pass to
the i-th of N contiguous parts, so N jobs (a multirun over ``data.shard``) cover the dataset
once between them and their sample ids stay the dataset's own. Without an optimizer and without
an entry that needs gradients, the pass runs under ``torch.no_grad``: a dataset pass measures.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from common.errors import ConfigError
from runner.config.schema import RunConfig
from runner.sources.batches import Batch
from runner.sources.data import DataSource


def applies(settings: RunConfig, data: DataSource) -> bool:
    """Whether the run is a whole-dataset pass: eval (or generate) mode over data with a length."""
    return settings.mode.value in ("eval", "generate") and data.items is not None


def shard_range(data: DataSource) -> tuple[int, int]:
    """The items ``[start, stop)`` of this job's shard: the ``shard``-th of ``num_shards`` contiguous parts."""
    shard, shards = int(data.data.get("shard") or 0), int(data.data.get("num_shards") or 1)
    length = data.items.length
    return shard * length // shards, (shard + 1) * length // shards


def check(settings: RunConfig, data: DataSource) -> None:
    """Refuse shard settings that name no part, or that a run which is not a dataset pass would ignore."""
    shard, shards = int(data.data.get("shard") or 0), int(data.data.get("num_shards") or 1)
    if shards < 1:
        raise ConfigError(f"data.num_shards: {shards} must be at least 1")
    if not 0 <= shard < shards:
        raise ConfigError(f"data.shard: {shard} must be in [0, {shards - 1}] (data.num_shards={shards})")
    if shards > 1 and not applies(settings, data):
        why = ("has no length to split" if data.items is None else "is a training stream; shards split a "
               "whole-dataset pass: add mode=eval")
        raise ConfigError(f"data.num_shards: {shards} but data={data.kind} {why}")
    if shards > 1:
        start, stop = shard_range(data)
        if start == stop:
            raise ConfigError(f"data.shard: {shard} of {shards} holds no item of the {data.items.length}")


def epoch_steps(settings: RunConfig, data: DataSource, epochs: int) -> int:
    """The steps of ``epochs`` passes: over this shard's items in order for a dataset pass, else
    the data kind's own training epochs."""
    if not applies(settings, data):
        return data.epoch_steps(epochs)
    start, stop = shard_range(data)
    return epochs * -(-(stop - start) // data.items.batch_size)


def batches(data: DataSource, seed: int, device: torch.device, skip: int = 0) -> Iterator[Batch]:
    """This shard's items in order, epoch after epoch, each batch with its ``samples``; the first
    epoch without its first ``skip`` batches (``held_steps``), which are not read."""
    start, stop = shard_range(data)
    first = data.item_batches(start + skip * data.items.batch_size, stop, seed, device)
    return itertools.chain(first, itertools.chain.from_iterable(
        data.item_batches(start, stop, seed, device) for _ in itertools.count()))


def held_steps(data: DataSource, hooks, model: torch.nn.Module) -> int:
    """The first batches of the pass that every entry holds already (``HookType.samples_held``: the
    complete shards of the stores a killed pass left), which a resumed pass need not run.

    Whole batches only, so that the batches the pass runs are the ones an uninterrupted pass
    runs (the same float32 activations), and never the last one, so that every entry still
    sees a call and ends its run (a store already complete costs one batch)."""
    if not hooks:
        return 0
    start, stop = shard_range(data)
    held = min(min(hook.samples_held(model, start) for hook in hooks), stop - start - 1)
    return held // data.items.batch_size


def needs_gradient(optimizer_name: str, hooks) -> bool:
    """A dataset pass computes gradients only when asked: an optimizer, or an entry that needs them."""
    return optimizer_name != "none" or any(hook.needs_backward for hook in hooks)
