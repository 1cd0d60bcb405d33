"""The built-in data kinds, each registered with its schema: ``ones`` and ``randn`` (synthetic),
torchvision's ``fake`` images, ``image`` files, ``tokens`` ids, scikit-learn's labelled ``digits``.

A kind is a function ``(data, model) -> Maker`` registered with ``@DATA_KINDS.register(NAME,
schema=DATACLASS)``: it checks its keys and reads what must be read (image files) once.
``randn`` draws from its own generator seeded with the run's seed, so the data do not depend on
how many random numbers building the model consumed: step k always gets the same batch. ``fake``
reads torchvision's ``FakeData`` in order (``random_offset = seed * size``, so runs with
different seeds see different images) and uses its labels as targets. ``digits`` is real data
shipped with scikit-learn: a training stream reshuffled each epoch and a held-out part for the
eval passes. Each row keeps its identity in every pass (``Maker.make``'s ids): a digit its index in
``load_digits()`` (and its label as its class), a token set's sequence, a fake image or an image file
its index (the file its name); ``randn``, ``ones`` and ``tokens`` without a size have no items, so
their samples are unnamed.
"""
from __future__ import annotations

import io
import itertools
from pathlib import Path

import torch
from omegaconf import DictConfig

from common.errors import ConfigError
from runner.config.registry import DATA_KINDS
from runner.config.schema import DigitsData, FakeImages, ImageFiles, SyntheticData, TokenData
from runner.sources.batches import Maker, imagenet_transform, in_batches, input_shape, numbered
from common.fingerprint import describe_bytes

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@DATA_KINDS.register("randn", schema=SyntheticData)
@DATA_KINDS.register("ones", schema=SyntheticData)
def _synthetic(data: DictConfig, model: DictConfig) -> Maker:
    shape = input_shape(data, model)
    if data.kind == "ones":
        return Maker(shape, torch.float32, lambda gen: ((torch.ones(shape), None) for _ in itertools.count()))
    return Maker(shape, torch.float32,
                  lambda gen: ((torch.randn(shape, generator=gen), None) for _ in itertools.count()))


@DATA_KINDS.register("fake", schema=FakeImages)
def _fake(data: DictConfig, model: DictConfig) -> Maker:
    """Batches of ``FakeData`` images and labels, in dataset order, cycling when it is used up."""
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    shape = input_shape(data, model)
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
        return ((x, y, torch.arange(i * shape[0], (i + 1) * shape[0]))
                for _ in itertools.count() for i, (x, y) in enumerate(loader))

    return Maker(shape, torch.float32, make)


@DATA_KINDS.register("tokens", schema=TokenData)
def _tokens(data: DictConfig, model: DictConfig) -> Maker:
    shape, vocab = input_shape(data, model), int(model.get("num_classes") or 0)
    if vocab < 1:
        raise ConfigError("data=tokens: model.num_classes (the vocabulary size) must be set")
    if data.get("size") is not None:
        return _token_set(data, shape, vocab)
    return Maker(shape, torch.long,
                 lambda gen: ((torch.randint(0, vocab, shape, generator=gen), None) for _ in itertools.count()))


def _token_set(data: DictConfig, shape: list[int], vocab: int) -> Maker:
    """``data.size`` fixed sequences (seeded by ``data.seed``, not the run's seed: every job of a
    sweep sees the same set): a dataset with a length, cycled in order by training steps."""
    size = int(data.size)
    if size < 1:
        raise ConfigError(f"data.size: {size} must be at least 1 (null: a new random batch each step)")
    if size < shape[0]:
        raise ConfigError(f"data.size: {size} sequences cannot fill a batch of {shape[0]}")
    tokens = torch.randint(0, vocab, (size, *shape[1:]), generator=torch.Generator().manual_seed(int(data.seed)))
    items = in_batches(tokens, None, shape[0])

    def make(gen: torch.Generator):  # whole batches, in order, one epoch after another
        return (xy for _ in itertools.count() for xy in numbered(items.read, 0, size - size % shape[0]))

    return Maker(shape, torch.long, make, epoch_steps=size // shape[0], items=items)


@DATA_KINDS.register("image", schema=ImageFiles)
def _images(data: DictConfig, model: DictConfig) -> Maker:
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
    images, fingerprints, ids = [], {}, torch.arange(len(files))
    for f in files:
        try:
            raw = f.read_bytes()  # read once: the image and, for one file, the manifest's fingerprint
            with Image.open(io.BytesIO(raw)) as img:
                images.append(transform(img.convert("RGB")))
        except OSError as exc:
            raise ConfigError(f"data.path: cannot read image '{f}': {exc}") from None
        if f == path:
            fingerprints[str(data.path)] = describe_bytes(path, raw)
    batch = torch.stack(images)  # read once; each step gets a copy, as a model may change its input in place
    names = [f.name if f == path else f.relative_to(path).as_posix() for f in files]
    return Maker(list(batch.shape), batch.dtype, lambda gen: ((batch.clone(), None, ids) for _ in itertools.count()),
                 fingerprints=fingerprints, names=lambda i: (names[i], ""))


@DATA_KINDS.register("digits", schema=DigitsData)
def _digits(data: DictConfig, model: DictConfig) -> Maker:
    """scikit-learn's digits scaled to [0, 1] as [N, 1, 8, 8]: shuffled training batches of
    ``batch_size`` (each epoch a new order from the run's seed, the last partial batch dropped),
    and the held-out part (chosen by ``split_seed``) as one batch for eval passes."""
    from sklearn.datasets import load_digits  # a dependency of the project, imported when data=digits asks
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
                yield x[index], y[index], index  # each digit named by its index in load_digits()

    return Maker([size, 1, 8, 8], torch.float32, make,
                 held_out=lambda gen: ((x[held], y[held], held) for _ in itertools.count()),
                 epoch_steps=len(train) // size,
                 items=in_batches(x, y, size))
