"""Losses by name: what turns the model's output into the scalar that backward starts from."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.slots import walk
from runner.config.registry import LOSSES

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Losses without options, registered as ``build(cfg) -> LossFn`` (``none``: no loss, a forward-only run).
for _name, _loss in {
    "sum": lambda out, _: out.sum(),
    "mean": lambda out, _: out.mean(),
    "one_minus_mean": lambda out, _: (1 - out).mean(),
    "log_mean": lambda out, _: out.log().mean(),
    "cross_entropy": lambda out, targets: F.cross_entropy(_class_scores(out, "cross_entropy"), targets),
    "none": None,
}.items():
    LOSSES.register(_name)(lambda cfg, loss=_loss: loss)


def _class_scores(out: torch.Tensor, loss: str) -> torch.Tensor:
    """``out`` if it is ``[batch, classes]``, the shape a class target per sample fits; else the one-line
    error (the plan's rehearsal raises it before the run: a token model's ``[batch, positions, vocab]``)."""
    if out.dim() != 2:
        raise ConfigError(f"loss={loss}: the model output has shape {list(out.shape)}, not [batch, classes] "
                          f"(one class per sample); use loss=sum, mean or none")
    return out


@LOSSES.register("class_score")
def class_score_loss(cfg: DictConfig) -> LossFn:
    """``class_score`` with the config's ``target_class``."""
    return class_score(cfg.get("target_class"))


def class_score(target_class: int | None) -> ClassScore:
    """``out[i, c].sum()`` over the batch: backward starts from one class score, as Grad-CAM needs.

    ``target_class=None`` takes each sample's top-scoring class (the prediction being explained).
    """
    if target_class is not None and (isinstance(target_class, bool) or not isinstance(target_class, int)
                                     or target_class < 0):
        raise ConfigError(f"loss.target_class: {target_class!r} must be a class index >= 0 or null")
    return ClassScore(target_class)


class ClassScore:
    """The ``class_score`` loss; ``chosen`` keeps the classes it took for the samples of its first
    real batch (no ``target_class``: each one's top class), which the Grad-CAM picture names."""

    def __init__(self, target_class: int | None) -> None:
        self.target_class = target_class
        self.chosen: list[int] | None = None

    def __call__(self, out: torch.Tensor, _targets: torch.Tensor) -> torch.Tensor:
        _class_scores(out, "class_score")
        if self.target_class is None:
            index = out.detach().argmax(dim=1, keepdim=True)
            if self.chosen is None and out.device.type != "meta":  # the plan's rehearsal has no values
                self.chosen = index.flatten().tolist()
        elif self.target_class >= out.shape[1]:
            raise ConfigError(f"loss.target_class: {self.target_class} is out of range for {out.shape[1]} classes")
        else:
            index = torch.full((out.shape[0], 1), self.target_class, dtype=torch.long, device=out.device)
        return out.gather(1, index).sum()


def first_tensor(output: object) -> torch.Tensor:
    """The tensor a loss is computed on: the output itself, or the first tensor inside it."""
    for _, t in walk(output):
        return t
    raise ConfigError(f"loss: the model returned {type(output).__name__} with no tensor in it")


#: Losses whose targets are classes: their steps report ``accuracy`` (argmax over dim 1, as the loss reads it).
CLASSIFICATION_LOSSES = frozenset({"cross_entropy"})


def correct(out: torch.Tensor, targets: torch.Tensor) -> int:
    """How many samples of a classification batch the model's top class gets right."""
    return int((out.detach().argmax(dim=1) == targets).sum())


def get_loss(loss: str | DictConfig) -> LossFn | None:
    """The loss a ``loss`` config (or a bare name) names; ``None`` for ``none`` (a forward-only run).

    The config also carries the options of losses that have some (``class_score``'s
    ``target_class``); a bare name takes their defaults.
    """
    cfg = OmegaConf.create({"name": loss}) if isinstance(loss, str) else loss
    return LOSSES.get(cfg.name).build(cfg)
