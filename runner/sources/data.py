"""Input batches: constant ``ones``, seeded ``randn``, torchvision's ``fake`` images, ``image`` files, or ``tokens`` ids.

The shape follows the model (``model.input_shape``) unless ``data.shape`` is given. ``randn``
draws from its own generator seeded with the run's seed, so the data do not depend on how many
random numbers building the model consumed: step k always gets the same batch. ``fake`` reads
torchvision's ``FakeData`` in order (``random_offset = seed * size``, so runs with different seeds
see different images) and uses its labels as targets: a training run sees a new labelled batch
each step.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from hooks.errors import ConfigError, choice_error

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class Batch:
    """One step's model input and (for losses that need them) class targets."""

    x: torch.Tensor
    targets: torch.Tensor


def batches(data: DictConfig, model: DictConfig, seed: int, device: torch.device) -> Iterator[Batch]:
    """One ``Batch`` per step, forever; ``run`` takes ``steps`` of them.

    The config is checked (and images are read) now, not at the first ``next``, so a bad data
    config fails before the run writes anything.
    """
    kind = data.get("kind")
    makers = {"ones": _synthetic, "randn": _synthetic, "fake": _fake, "image": _images, "tokens": _tokens}
    if kind not in makers:
        raise choice_error("data.kind", kind, makers, "data kind")
    if model.get("input_kind") == "tokens" and kind != "tokens":
        raise ConfigError(f"data: this model takes token ids, not data={kind}; add data=tokens")
    gen = torch.Generator().manual_seed(int(seed))
    return _batches(makers[kind](data, model, gen), data, model, gen, device)


def _batches(source: Iterator[tuple[torch.Tensor, torch.Tensor | None]], data: DictConfig, model: DictConfig,
             gen: torch.Generator, device: torch.device) -> Iterator[Batch]:
    for x, labels in source:
        if labels is None or data.get("targets") is not None:
            labels = _targets(data, model, x.shape[0], gen)
        x = x.to(device)
        if data.get("requires_grad"):
            x.requires_grad_(True)
        yield Batch(x=x, targets=labels.to(device))


def _shape(data: DictConfig, model: DictConfig) -> list[int]:
    shape = data.get("shape") or model.get("input_shape")
    if not shape:
        raise ConfigError("data.shape: not set and the model config has no input_shape; "
                          "give one, e.g. data.shape=[1,3,224,224]")
    shape = list(shape)
    if not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(f"data.shape: {shape} must be a list of positive integers")
    return shape


def _synthetic(data: DictConfig, model: DictConfig, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, None]]:
    shape = _shape(data, model)
    if data.kind == "ones":
        return ((torch.ones(shape), None) for _ in itertools.count())
    return ((torch.randn(shape, generator=gen), None) for _ in itertools.count())


def _fake(data: DictConfig, model: DictConfig, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of ``FakeData`` images and labels, in dataset order, cycling when it is used up."""
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    shape = _shape(data, model)
    if len(shape) != 4 or shape[1] not in (1, 3, 4):
        raise ConfigError(f"data.shape: {shape}: fake images need [N, C, H, W] with C in 1, 3, 4")
    size = int(data.size)
    if size < shape[0]:
        raise ConfigError(f"data.size: {size} images cannot fill a batch of {shape[0]}")
    classes = int(data.get("num_classes") or model.get("num_classes") or 1)
    dataset = datasets.FakeData(size=size, image_size=tuple(shape[1:]), num_classes=classes,
                                transform=transforms.ToTensor(), random_offset=gen.initial_seed() * size)
    loader = DataLoader(dataset, batch_size=shape[0], drop_last=True)
    return ((x, y) for _ in itertools.count() for x, y in loader)


def _tokens(data: DictConfig, model: DictConfig, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, None]]:
    shape, vocab = _shape(data, model), int(model.get("num_classes") or 0)
    if vocab < 1:
        raise ConfigError("data=tokens: model.num_classes (the vocabulary size) must be set")
    return ((torch.randint(0, vocab, shape, generator=gen), None) for _ in itertools.count())


def _targets(data: DictConfig, model: DictConfig, n: int, gen: torch.Generator) -> torch.Tensor:
    given = data.get("targets")
    if given is not None:
        values = [given] * n if isinstance(given, int) else list(given)
        if len(values) != n:
            raise ConfigError(f"data.targets: {len(values)} targets for a batch of {n}")
        return torch.tensor(values, dtype=torch.long)
    classes = int(model.get("num_classes") or 1)
    return torch.randint(0, classes, (n,), generator=gen)


def _images(data: DictConfig, model: DictConfig, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, None]]:
    """Load one image or a folder of them as the torchvision ImageNet transforms would."""
    from PIL import Image
    from torchvision import transforms

    path = Path(str(data.get("path") or ""))
    if not str(data.get("path") or ""):
        raise ConfigError("data.path: required for data=image (a file or a folder of images)")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ConfigError(f"data.path: folder '{path}' holds no image ({', '.join(IMAGE_SUFFIXES)})")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"data.path: no file or folder at '{path}'")
    transform = transforms.Compose([
        transforms.Resize(int(data.resize)),
        transforms.CenterCrop(int(data.crop)),
        transforms.ToTensor(),
        transforms.Normalize(list(data.mean), list(data.std)),
    ])
    images = []
    for f in files:
        try:
            with Image.open(f) as img:
                images.append(transform(img.convert("RGB")))
        except OSError as exc:
            raise ConfigError(f"data.path: cannot read image '{f}': {exc}") from None
    batch = torch.stack(images)
    return ((batch.clone(), None) for _ in itertools.count())  # a model may change its input in place
