"""What every data kind builds on: a ``Batch``, the ``Maker`` a kind returns, the input shape a
config asks for, and torchvision's ImageNet preparation. Knows no data kind (they register in
``runner.config.registry.DATA_KINDS``, see ``runner.sources.kinds``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from common.errors import ConfigError


@dataclass
class Batch:
    """One step's model input and (for losses that need them) class targets."""

    x: torch.Tensor
    targets: torch.Tensor
    #: the data's own id of each row (its dataset index, wherever the batch was drawn: shuffled, held
    #: out, sharded), else None: a source that cannot say (an infinite random stream)
    samples: torch.Tensor | None = None


@dataclass
class Maker:
    """How a data kind makes its batches: ``make(gen)`` yields ``(x, labels or None)`` forever, or
    ``(x, labels or None, ids)`` where the kind knows each row's dataset index (``ids``, int64:
    what names a sample in every table, ``Batch.samples``); ``held_out(gen)`` likewise from a part
    kept apart for eval passes (``None``: no such part). ``names(i)``: item ``i``'s ``(name, class)``
    (as ``ItemRange.names``; null: ``items``' own, if any)."""

    shape: list[int]
    dtype: torch.dtype
    make: Callable[[torch.Generator], Iterator[tuple[torch.Tensor, torch.Tensor | None]]]
    held_out: Callable[[torch.Generator], Iterator[tuple[torch.Tensor, torch.Tensor | None]]] | None = None
    epoch_steps: int | None = None  #: training batches in one pass over the data; None: no such thing
    #: a whole-dataset pass (``runner.engine.whole_pass``): the items, their number and the batch size
    items: ItemRange | None = None
    #: fingerprints of the files the kind read (``common.fingerprint.describe_bytes``), by path
    fingerprints: dict[str, dict] = field(default_factory=dict)
    names: Callable[[int], tuple[str, str]] | None = None


@dataclass
class ItemRange:
    """A data kind with a length, read in order: ``read(start, stop)`` yields ``(x, labels or None)``
    batches of ``batch_size`` over items ``start..stop-1`` (the last one may be smaller); ``names(i)``
    is item ``i`` as its user knows it, ``(name, class)`` (a file path under the folder and its class
    folder; ``""`` where the kind has none: the index is its name), read from the index alone."""

    length: int
    batch_size: int
    read: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor | None]]]
    names: Callable[[int], tuple[str, str]] | None = None


def numbered(read: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor | None]]], start: int,
             stop: int) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """``read(start, stop)``'s batches with each row's dataset index: ``(x, labels, ids)``."""
    first = start
    for x, labels in read(start, stop):
        yield x, labels, torch.arange(first, first + len(x))
        first += len(x)


def in_batches(x: torch.Tensor, y: torch.Tensor | None, size: int) -> ItemRange:
    """Items held in memory (``digits``, ``tokens`` with a size), read in order; an item with a
    label ``y`` is of class ``str(y)``."""
    def read(start: int, stop: int):
        for first in range(start, stop, size):
            last = min(first + size, stop)
            yield x[first:last].clone(), None if y is None else y[first:last]

    return ItemRange(len(x), size, read, None if y is None else lambda i: ("", str(int(y[i]))))


def input_shape(data: DictConfig, model: DictConfig) -> list[int]:
    shape = data.get("shape") or model.get("input_shape")
    if not shape:
        raise ConfigError("data.shape: not set and the model config has no input_shape; "
                          "give one, e.g. data.shape=[1,3,224,224]")
    shape = list(shape)
    if not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(f"data.shape: {shape} must be a list of positive integers")
    return shape


def imagenet_transform(data: DictConfig):
    """torchvision's ImageNet preparation with ``data``'s sizes and normalisation (``image``, ``imagefolder``)."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(int(data.resize)),
        transforms.CenterCrop(int(data.crop)),
        transforms.ToTensor(),
        transforms.Normalize(list(data.mean), list(data.std)),
    ])
