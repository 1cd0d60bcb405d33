"""Losses by name: what turns the model's output into the scalar that backward starts from."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hooks.errors import ConfigError, choice_error
from hooks.recorder import walk

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

LOSSES: dict[str, LossFn | None] = {
    "sum": lambda out, _: out.sum(),
    "mean": lambda out, _: out.mean(),
    "one_minus_mean": lambda out, _: (1 - out).mean(),
    "log_mean": lambda out, _: out.log().mean(),
    "cross_entropy": lambda out, targets: F.cross_entropy(out, targets),
    "none": None,
}


def first_tensor(output: object) -> torch.Tensor:
    """The tensor a loss is computed on: the output itself, or the first tensor inside it."""
    for _, t in walk(output):
        return t
    raise ConfigError(f"loss: the model returned {type(output).__name__} with no tensor in it")


def get_loss(name: str) -> LossFn | None:
    """The loss called ``name``; ``None`` for ``none`` (a forward-only run)."""
    if name not in LOSSES:
        raise choice_error("loss.name", name, LOSSES, "loss")
    return LOSSES[name]
