"""``DataSource``: a checked data config, built once, streamed as often as asked.

The kind (``runner.config.registry.DATA_KINDS``: ``runner.sources.kinds``, ``runner.sources.datasets``
or your own module) makes the batches; this adds what every kind shares: the seeded generator,
class targets, the device and ``requires_grad``. The shape follows the model
(``model.input_shape``) unless ``data.shape`` is given. Kinds with a length also read their items in order
(``item_batches``), for a pass over the whole dataset (``runner.engine.whole_pass``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from omegaconf import DictConfig

from common.errors import ConfigError
from runner.config.registry import DATA_KINDS
from runner.sources.batches import Batch, ItemRange, numbered


#: The dtypes of token ids an embedding takes (``model.input_kind: tokens``: ``data=tokens``, or a
#: ``data=dataset`` of integer ids).
TOKEN_DTYPES = (torch.int64, torch.int32)


class DataSource:
    """A checked data config, built once: ``batches(seed, device)`` streams it as often as asked.

    Building checks the config and reads what must be read (image files) once; each call of
    ``batches`` starts the stream afresh from ``seed``, so the training stream and the held-out
    eval stream come from one source. ``input_shape`` is known without drawing a batch.
    """

    def __init__(self, data: DictConfig, model: DictConfig) -> None:
        kind = data.kind  # checked by the gate (``runner.engine.plan``)
        self.data, self.model, self.kind = data, model, kind
        self._make = DATA_KINDS.get(kind).build(data, model)
        self.input_shape, self.input_dtype = self._make.shape, self._make.dtype
        if model.get("input_kind") == "tokens" and self.input_dtype not in TOKEN_DTYPES:
            raise ConfigError(f"data: this model takes token ids (integers), but data={kind} gives {self.input_dtype} "
                              f"{list(self.input_shape)}; use data=tokens, or data=dataset whose items are integer ids")
        self.fingerprints = self._make.fingerprints  # of the files already read (runner.store.provenance)
        self._check_targets()

    def batches(self, seed: int, device: torch.device, held_out: bool = False) -> Iterator[Batch]:
        """One ``Batch`` per step, forever, drawn from a generator seeded with ``seed``; ``held_out``:
        the eval stream, from data the training stream never shows where the kind has such a part.
        ``data.seed`` is added to ``seed``: a corrupted batch for the clean one, on the same model."""
        gen = torch.Generator().manual_seed(int(seed) + int(self.data.get("seed") or 0))
        make = self._make.held_out if held_out and self._make.held_out is not None else self._make.make
        for x, labels, *ids in make(gen):
            batch = self._batch(x, labels, gen, device)
            batch.samples = ids[0].to(torch.int64).cpu() if ids else None
            yield batch

    @property
    def items(self) -> ItemRange | None:
        """The items of a data kind with a length, in order (``None``: a stream without one)."""
        return self._make.items

    def item_batches(self, start: int, stop: int, seed: int, device: torch.device) -> Iterator[Batch]:
        """Items ``start..stop-1`` in order, once, each ``Batch`` with their indices as ``samples``."""
        gen = torch.Generator().manual_seed(int(seed) + int(self.data.get("seed") or 0))
        for x, labels, ids in numbered(self._make.items.read, start, stop):
            batch = self._batch(x, labels, gen, device)
            batch.samples = ids
            yield batch

    @property
    def sample_names(self) -> Callable[[int], tuple[str, str]] | None:
        """A dataset index's ``(name, class)`` as its user knows it (``ItemRange.names``), in every pass
        whose batches carry indices (``Batch.samples``); ``None`` where the kind names none."""
        return self._make.names or (self._make.items.names if self._make.items is not None else None)

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


def _targets(data: DictConfig, model: DictConfig, n: int, gen: torch.Generator) -> torch.Tensor:
    given = data.get("targets")
    if given is not None:
        values = [given] * n if isinstance(given, int) else list(given)
        if len(values) != n:
            raise ConfigError(f"data.targets: {len(values)} targets for a batch of {n}")
        return torch.tensor(values, dtype=torch.long)
    classes = int(model.get("num_classes") or 1)
    return torch.randint(0, classes, (n,), generator=gen)


