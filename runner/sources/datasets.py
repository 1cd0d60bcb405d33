"""``data=dataset`` and ``data=imagefolder``: any ``torch.utils.data.Dataset``, batched by a ``DataLoader``.

``data=dataset`` calls ``data._target_`` (a ``Dataset`` class or a function annotated to return
one, checked before it is called, as ``model._target_`` is) with ``data.kwargs``;
``data=imagefolder`` is torchvision's ``ImageFolder`` at ``data.path`` with the ImageNet
transforms of ``data=image``. An item is the input or ``(input, label, ...)``; an integer label
is the class target. ``held_out`` keeps a seeded fraction apart (``split_seed``) for the eval
passes, read in order; the rest is the training stream, a ``DataLoader`` whose shuffling (and
workers' seeds) come from the run's seed, one epoch after another.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, default_collate, random_split

from common.errors import ConfigError
from runner.config.registry import DATA_KINDS
from runner.config.schema import DatasetData, ImageFolderData
from runner.sources.batches import ItemRange, Maker, imagenet_transform
from runner.sources.targets import builds, check_arguments, locate


@DATA_KINDS.register("imagefolder", schema=ImageFolderData)
@DATA_KINDS.register("dataset", schema=DatasetData)
def loader_maker(data: DictConfig, model: DictConfig) -> Maker:
    """Build the dataset once, check the loader settings, and stream its batches from a seed."""
    if data.get("shape") is not None:
        raise ConfigError(f"data.shape: data={data.kind} takes its shape from the dataset's items; "
                          f"set data.batch_size instead")
    dataset = image_folder(data, model) if data.kind == "imagefolder" else user_dataset(data)
    size, workers, fraction = int(data.batch_size), int(data.num_workers), float(data.held_out)
    if size < 1:
        raise ConfigError(f"data.batch_size: {size} must be at least 1")
    if workers < 0:
        raise ConfigError(f"data.num_workers: {workers} must be at least 0 (0 = load in the main process)")
    if not 0 <= fraction < 1:
        raise ConfigError(f"data.held_out: {fraction} must be a fraction in [0, 1)")
    train, held = _split(dataset, fraction, int(data.split_seed))
    x, _ = _first_batch(train, data)
    options = {"batch_size": size, "num_workers": workers}

    def make(gen: torch.Generator):
        loader = DataLoader(_numbered(train, dataset), shuffle=bool(data.shuffle), drop_last=bool(data.drop_last),
                            generator=gen, **options)
        return _forever(loader, data)

    def held_out(gen: torch.Generator):
        return _forever(DataLoader(_numbered(held, dataset), generator=gen, **options), data)

    epoch = None
    if not isinstance(train, IterableDataset):
        epoch = len(train) // size if data.drop_last else -(-len(train) // size)
        if epoch == 0:
            raise ConfigError(f"data.batch_size: {size} is more than the {len(train)} training items with drop_last")
    items = None if isinstance(dataset, IterableDataset) else ItemRange(len(dataset), size, _reader(dataset, options),
                                                                      folder_names(dataset))
    return Maker([size, *x.shape[1:]], x.dtype, make, held_out if held is not None else None, epoch, items)


class Numbered(Dataset):
    """``part``'s items as ``(dataset index, item)``: the index in the whole dataset (through a
    ``random_split`` part's ``Subset``) travels with each item through the loader's shuffling and workers."""

    def __init__(self, part: Dataset, ids: list[int] | None) -> None:
        self.part, self.ids = part, ids

    def __len__(self) -> int:
        return len(self.part)

    def __getitem__(self, i: int):
        return (self.ids[i] if self.ids is not None else i), self.part[i]


def _numbered(part: Dataset, whole: Dataset) -> Dataset:
    """``Numbered(part)`` of ``whole`` (itself, or a ``random_split`` part); an ``IterableDataset`` as it
    is: its items have no index (unnamed)."""
    if isinstance(part, IterableDataset):
        return part
    return Numbered(part, None if part is whole else list(part.indices))


def _reader(dataset: Dataset, options: dict):
    """Items ``start..stop-1`` of the whole dataset (held-out part included), in order."""
    def read(start: int, stop: int):
        loader = DataLoader(Subset(dataset, range(start, stop)), shuffle=False, **options)
        return (_input_and_labels(batch) for batch in loader)

    return read


def folder_names(dataset: Dataset):
    """``ItemRange.names`` of a torchvision ``DatasetFolder`` (``ImageFolder``): item ``i``'s file path
    relative to the folder and its class folder's name; ``None`` for a dataset without them."""
    files, classes, root = (getattr(dataset, name, None) for name in ("samples", "classes", "root"))
    if not isinstance(files, list) or not isinstance(classes, list) or root is None:
        return None

    def names(i: int) -> tuple[str, str]:
        file, label = files[i]
        return Path(file).relative_to(root).as_posix(), str(classes[label])

    return names


def user_dataset(data: DictConfig) -> Dataset:
    """The dataset ``data._target_(**data.kwargs)`` builds, once the target is known to build one."""
    if OmegaConf.is_missing(data, "_target_"):
        raise ConfigError("data._target_: required for data=dataset, e.g. data._target_=mypkg.make_dataset")
    path = str(data._target_)
    target = locate(path, "data._target_")
    if not builds(target, Dataset):
        raise ConfigError(f"data._target_: '{path}' is not a torch.utils.data.Dataset class, nor a function "
                          f"annotated to return one (-> Dataset); refused without calling it")
    kwargs = OmegaConf.to_container(data.kwargs, resolve=True)
    check_arguments(target, path, kwargs, "data.kwargs.")
    try:
        dataset = target(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's code raised: one line naming the target
        raise ConfigError(f"data._target_: '{path}' raised {type(exc).__name__}: {_one_line(exc)}") from None
    if not isinstance(dataset, Dataset):
        raise ConfigError(f"data._target_: '{path}' returned a {type(dataset).__name__}, "
                          f"not a torch.utils.data.Dataset")
    return dataset


def image_folder(data: DictConfig, model: DictConfig) -> Dataset:
    """torchvision's ``ImageFolder`` at ``data.path`` (``PATH/CLASS/IMAGE``), labels from the folder names."""
    from torchvision.datasets import ImageFolder

    if not data.get("path"):
        raise ConfigError("data.path: required for data=imagefolder (a folder with one subfolder of images per class)")
    path = Path(str(data.path))
    if not path.is_dir():
        raise ConfigError(f"data.path: no folder at '{path}'")
    try:
        dataset = ImageFolder(str(path), transform=imagenet_transform(data))
    except FileNotFoundError as exc:  # no class subfolder, or none holding an image
        raise ConfigError(f"data.path: '{path}' needs one subfolder of images per class "
                          f"(PATH/CLASS/IMAGE): {_one_line(exc)}") from None
    classes = model.get("num_classes")
    if classes is not None and len(dataset.classes) > int(classes):
        raise ConfigError(f"data.path: '{path}' has {len(dataset.classes)} classes ({', '.join(dataset.classes[:10])}"
                          f"{', ...' if len(dataset.classes) > 10 else ''}) but model.num_classes={classes}")
    return dataset


def _split(dataset: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """The training part and the held-out part (``None`` when ``fraction`` is 0), chosen by ``seed``."""
    if fraction == 0:
        return dataset, None
    if isinstance(dataset, IterableDataset):
        raise ConfigError("data.held_out: an IterableDataset has no items to hold out; set data.held_out=0")
    held = round(len(dataset) * fraction)
    if not 0 < held < len(dataset):
        raise ConfigError(f"data.held_out: {fraction} of {len(dataset)} items leaves "
                          f"{'none' if held == 0 else 'nothing to train on'}")
    train, held_part = random_split(dataset, [len(dataset) - held, held], generator=torch.Generator().manual_seed(seed))
    return train, held_part


def _first_batch(dataset: Dataset, data: DictConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first item as a batch of one: the input's shape and dtype, known before the run."""
    if isinstance(dataset, IterableDataset):
        if data.shuffle:
            raise ConfigError("data.shuffle: an IterableDataset sets its own order; set data.shuffle=false")
        item = next(iter(dataset), None)
    else:
        item = dataset[0] if len(dataset) else None
    if item is None:
        raise ConfigError(f"data: the {data.kind} dataset has no items")
    try:
        return _input_and_labels(default_collate([item]))
    except (TypeError, RuntimeError, ConfigError) as exc:
        raise ConfigError(f"data: items of the {data.kind} dataset cannot be batched: {_one_line(exc)}") from None


def _forever(loader: DataLoader, data: DictConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    for _ in itertools.count():
        empty = True
        for batch in loader:
            empty = False
            if isinstance(loader.dataset, Numbered):
                yield (*_input_and_labels(batch[1]), batch[0])
            else:
                yield _input_and_labels(batch)
        if empty:
            raise ConfigError(f"data: the {data.kind} dataset yielded no batch")


def _input_and_labels(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A collated batch as ``(input, labels or None)``: the labels are a second element of integers."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    if not isinstance(batch, (list, tuple)) or not batch or not isinstance(batch[0], torch.Tensor):
        raise ConfigError(f"an item must be a tensor or (tensor, label, ...), not a {type(batch).__name__}")
    labels = batch[1] if len(batch) > 1 else None
    integer = isinstance(labels, torch.Tensor) and labels.dim() == 1 and labels.dtype in _INTEGERS
    return batch[0], labels.long() if integer else None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
