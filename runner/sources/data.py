"""Input batches: constant ``ones``, seeded ``randn``, torchvision's ``fake`` images, ``image`` files,
``tokens`` ids, scikit-learn's labelled ``digits``, or any ``dataset`` / ``imagefolder`` through a
``DataLoader`` (``runner.sources.datasets``).

The shape follows the model (``model.input_shape``) unless ``data.shape`` is given. ``randn``
draws from its own generator seeded with the run's seed, so the data do not depend on how many
random numbers building the model consumed: step k always gets the same batch. ``fake`` reads
torchvision's ``FakeData`` in order (``random_offset = seed * size``, so runs with different seeds
see different images) and uses its labels as targets: a training run sees a new labelled batch
each step. ``digits`` is real data shipped with scikit-learn: a training stream reshuffled each
epoch and a held-out part for the eval passes (``batches(..., held_out=True)``). ``tokens`` with
``data.size=N`` is a fixed set of N sequences. Kinds with a length also read their items in order
(``item_batches``), for a pass over the whole dataset (``runner.engine.whole_pass``).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
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
    samples: torch.Tensor | None = None  #: the dataset index of each row (a whole-dataset pass), else None


class DataSource:
    """A checked data config, built once: ``batches(seed, device)`` streams it as often as asked.

    Building checks the config and reads what must be read (image files) once; each call of
    ``batches`` starts the stream afresh from ``seed``, so the training stream and the held-out
    eval stream come from one source. ``input_shape`` is known without drawing a batch.
    """

    def __init__(self, data: DictConfig, model: DictConfig) -> None:
        kind = data.get("kind")
        makers = {"ones": _synthetic, "randn": _synthetic, "fake": _fake, "image": _images, "tokens": _tokens,
                  "digits": _digits, "dataset": _loaded, "imagefolder": _loaded}
        if kind not in makers:
            raise choice_error("data.kind", kind, makers, "data kind")
        if model.get("input_kind") == "tokens" and kind != "tokens":
            raise ConfigError(f"data: this model takes token ids, not data={kind}; add data=tokens")
        self.data, self.model, self.kind = data, model, kind
        self._make = makers[kind](data, model)
        self.input_shape, self.input_dtype = self._make.shape, self._make.dtype
        self._check_targets()

    def batches(self, seed: int, device: torch.device, held_out: bool = False) -> Iterator[Batch]:
        """One ``Batch`` per step, forever, drawn from a generator seeded with ``seed``; ``held_out``:
        the eval stream, from data the training stream never shows where the kind has such a part.
        ``data.seed`` is added to ``seed``: a corrupted batch for the clean one, on the same model."""
        gen = torch.Generator().manual_seed(int(seed) + int(self.data.get("seed") or 0))
        make = self._make.held_out if held_out and self._make.held_out is not None else self._make.make
        for x, labels in make(gen):
            yield self._batch(x, labels, gen, device)

    @property
    def items(self) -> ItemRange | None:
        """The items of a data kind with a length, in order (``None``: a stream without one)."""
        return self._make.items

    def item_batches(self, start: int, stop: int, seed: int, device: torch.device) -> Iterator[Batch]:
        """Items ``start..stop-1`` in order, once, each ``Batch`` with their indices as ``samples``."""
        gen = torch.Generator().manual_seed(int(seed) + int(self.data.get("seed") or 0))
        first = start
        for x, labels in self._make.items.read(start, stop):
            batch = self._batch(x, labels, gen, device)
            batch.samples = torch.arange(first, first + len(x))
            first += len(x)
            yield batch

    def _batch(self, x: torch.Tensor, labels: torch.Tensor | None, gen: torch.Generator,
               device: torch.device) -> Batch:
        if labels is None or self.data.get("targets") is not None:
            labels = _targets(self.data, self.model, x.shape[0], gen)
        x = x.to(device)
        if self.data.get("requires_grad"):
            x.requires_grad_(True)
        return Batch(x=x, targets=labels.to(device))

    def epoch_steps(self, epochs: int) -> int:
        """The training steps of ``epochs`` passes over the data (``epochs=N`` instead of ``steps``)."""
        if self._make.epoch_steps is None:
            raise ConfigError(f"epochs: data={self.kind} has no length to count epochs in; use steps=N")
        return epochs * self._make.epoch_steps

    def _check_targets(self) -> None:
        """Class targets must be classes of the model: cross_entropy fails mid-run otherwise."""
        given, classes = self.data.get("targets"), self.model.get("num_classes")
        if given is None:
            return
        values = [given] if isinstance(given, int) else list(given)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or (
                    classes is not None and not 0 <= value < int(classes)):
                raise ConfigError(f"data.targets: {value!r} is not a class of a model with "
                                  f"num_classes={classes}; use integers in [0, {int(classes or 1) - 1}]")
        if not isinstance(given, int) and len(values) != self.input_shape[0]:
            raise ConfigError(f"data.targets: {len(values)} targets for a batch of {self.input_shape[0]}")


@dataclass
class _Maker:
    """How a data kind makes its batches: ``make(gen)`` yields ``(x, labels or None)`` forever;
    ``held_out(gen)`` likewise from a part kept apart for eval passes (``None``: no such part)."""

    shape: list[int]
    dtype: torch.dtype
    make: Callable[[torch.Generator], Iterator[tuple[torch.Tensor, torch.Tensor | None]]]
    held_out: Callable[[torch.Generator], Iterator[tuple[torch.Tensor, torch.Tensor | None]]] | None = None
    epoch_steps: int | None = None  #: training batches in one pass over the data; None: no such thing
    #: a whole-dataset pass (``runner.engine.whole_pass``): the items, their number and the batch size
    items: ItemRange | None = None


@dataclass
class ItemRange:
    """A data kind with a length, read in order: ``read(start, stop)`` yields ``(x, labels or None)``
    batches of ``batch_size`` over items ``start..stop-1`` (the last one may be smaller)."""

    length: int
    batch_size: int
    read: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor | None]]]


def _in_batches(x: torch.Tensor, y: torch.Tensor | None, size: int) -> ItemRange:
    """Items held in memory (``digits``, ``tokens`` with a size), read in order."""
    def read(start: int, stop: int):
        for first in range(start, stop, size):
            last = min(first + size, stop)
            yield x[first:last].clone(), None if y is None else y[first:last]

    return ItemRange(len(x), size, read)


def _shape(data: DictConfig, model: DictConfig) -> list[int]:
    shape = data.get("shape") or model.get("input_shape")
    if not shape:
        raise ConfigError("data.shape: not set and the model config has no input_shape; "
                          "give one, e.g. data.shape=[1,3,224,224]")
    shape = list(shape)
    if not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(f"data.shape: {shape} must be a list of positive integers")
    return shape


def _synthetic(data: DictConfig, model: DictConfig) -> _Maker:
    shape = _shape(data, model)
    if data.kind == "ones":
        return _Maker(shape, torch.float32, lambda gen: ((torch.ones(shape), None) for _ in itertools.count()))
    return _Maker(shape, torch.float32,
                  lambda gen: ((torch.randn(shape, generator=gen), None) for _ in itertools.count()))


def _fake(data: DictConfig, model: DictConfig) -> _Maker:
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

    def make(gen: torch.Generator):
        dataset = datasets.FakeData(size=size, image_size=tuple(shape[1:]), num_classes=classes,
                                    transform=transforms.ToTensor(), random_offset=gen.initial_seed() * size)
        loader = DataLoader(dataset, batch_size=shape[0], drop_last=True)
        return ((x, y) for _ in itertools.count() for x, y in loader)

    return _Maker(shape, torch.float32, make)


def _tokens(data: DictConfig, model: DictConfig) -> _Maker:
    shape, vocab = _shape(data, model), int(model.get("num_classes") or 0)
    if vocab < 1:
        raise ConfigError("data=tokens: model.num_classes (the vocabulary size) must be set")
    if data.get("size") is not None:
        return _token_set(data, shape, vocab)
    return _Maker(shape, torch.long,
                  lambda gen: ((torch.randint(0, vocab, shape, generator=gen), None) for _ in itertools.count()))


def _token_set(data: DictConfig, shape: list[int], vocab: int) -> _Maker:
    """``data.size`` fixed sequences (seeded by ``data.seed``, not the run's seed: every job of a
    sweep sees the same set): a dataset with a length, cycled in order by training steps."""
    size = int(data.size)
    if size < 1:
        raise ConfigError(f"data.size: {size} must be at least 1 (null: a new random batch each step)")
    if size < shape[0]:
        raise ConfigError(f"data.size: {size} sequences cannot fill a batch of {shape[0]}")
    tokens = torch.randint(0, vocab, (size, *shape[1:]), generator=torch.Generator().manual_seed(int(data.seed)))
    items = _in_batches(tokens, None, shape[0])

    def make(gen: torch.Generator):  # whole batches, in order, one epoch after another
        return (xy for _ in itertools.count() for xy in items.read(0, size - size % shape[0]))

    return _Maker(shape, torch.long, make, epoch_steps=size // shape[0], items=items)


def _targets(data: DictConfig, model: DictConfig, n: int, gen: torch.Generator) -> torch.Tensor:
    given = data.get("targets")
    if given is not None:
        values = [given] * n if isinstance(given, int) else list(given)
        if len(values) != n:
            raise ConfigError(f"data.targets: {len(values)} targets for a batch of {n}")
        return torch.tensor(values, dtype=torch.long)
    classes = int(model.get("num_classes") or 1)
    return torch.randint(0, classes, (n,), generator=gen)


def imagenet_transform(data: DictConfig):
    """torchvision's ImageNet preparation with ``data``'s sizes and normalisation (``image``, ``imagefolder``)."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(int(data.resize)),
        transforms.CenterCrop(int(data.crop)),
        transforms.ToTensor(),
        transforms.Normalize(list(data.mean), list(data.std)),
    ])


def _loaded(data: DictConfig, model: DictConfig) -> _Maker:
    from runner.sources.datasets import loader_maker  # it builds on this module's _Maker

    return loader_maker(data, model)


def _images(data: DictConfig, model: DictConfig) -> _Maker:
    """Load one image or a folder of them as the torchvision ImageNet transforms would."""
    from PIL import Image

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
    transform = imagenet_transform(data)
    images = []
    for f in files:
        try:
            with Image.open(f) as img:
                images.append(transform(img.convert("RGB")))
        except OSError as exc:
            raise ConfigError(f"data.path: cannot read image '{f}': {exc}") from None
    batch = torch.stack(images)  # read once; each step gets a copy, as a model may change its input in place
    return _Maker(list(batch.shape), batch.dtype, lambda gen: ((batch.clone(), None) for _ in itertools.count()))


def _digits(data: DictConfig, model: DictConfig) -> _Maker:
    """scikit-learn's digits scaled to [0, 1] as [N, 1, 8, 8]: shuffled training batches of
    ``batch_size`` (each epoch a new order from the run's seed, the last partial batch dropped),
    and the held-out part (chosen by ``split_seed``) as one batch for eval passes."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("data=digits needs scikit-learn: pip install -e '.[digits]'") from None
    if data.get("shape") is not None:
        raise ConfigError("data.shape: data=digits is [batch_size, 1, 8, 8]; set data.batch_size instead")
    if not 0 < float(data.held_out) < 1:
        raise ConfigError(f"data.held_out: {data.held_out} must be a fraction between 0 and 1")
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(int(data.split_seed)))
    n_held = round(len(y) * float(data.held_out))
    train, held = order[n_held:], order[:n_held]
    size = int(data.batch_size)
    if not 1 <= size <= len(train):
        raise ConfigError(f"data.batch_size: {size} must be between 1 and the {len(train)} training digits")

    def make(gen: torch.Generator):
        for _ in itertools.count():
            epoch = train[torch.randperm(len(train), generator=gen)]
            for start in range(0, len(epoch) - size + 1, size):
                index = epoch[start:start + size]
                yield x[index], y[index]

    return _Maker([size, 1, 8, 8], torch.float32, make,
                  held_out=lambda gen: ((x[held], y[held]) for _ in itertools.count()), epoch_steps=len(train) // size,
                  items=_in_batches(x, y, size))
