"""Training runs: the optimizer a config names, one training step, and eval passes without gradients.

With ``optimizer=none`` (the default) every step is a measurement pass on the same weights: the
gradients are computed, changed by the hooks and recorded, never applied. With ``sgd`` or ``adam``
the optimizer steps after the hooks have done their work, so a gradient hook (``clip``) changes
what the model learns and ``steps.parquet`` shows it in the loss curve.
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

from common.errors import ConfigError
from hooks import HookSession
from runner.config.registry import OPTIMIZERS
from runner.engine.early_stop import forward_until_stop
from runner.sources.batches import Batch
from runner.sources.losses import LossFn, correct, first_tensor

#: Data of eval passes come from the run's seed plus this, a stream disjoint from the training batches.
EVAL_SEED_OFFSET = 1 << 20



def check_optimizer(spec) -> None:
    """Values the schema's types allow but that train nothing, or nonsense."""
    values = {k: v for k, v in asdict(spec).items() if k in ("lr", "momentum", "weight_decay", "eps")}
    for key, value in values.items():
        if not value >= 0:  # also rejects NaN
            raise ConfigError(f"optimizer.{key}: {value} must be >= 0")
    if values.get("lr") == 0:
        raise ConfigError("optimizer.lr: 0 would train nothing; use optimizer=none for measurement passes")
    if getattr(spec, "nesterov", False) and spec.momentum <= 0:
        raise ConfigError(f"optimizer.nesterov: needs momentum > 0 (got optimizer.momentum={spec.momentum})")
    betas = getattr(spec, "betas", None)
    if betas is not None and (len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas)):
        raise ConfigError(f"optimizer.betas: {list(betas)} must be two numbers in [0, 1)")


def build_optimizer(spec, model: nn.Module) -> torch.optim.Optimizer | None:
    """The torch optimizer over ``model``'s trainable parameters; ``None`` for ``optimizer=none``."""
    cls = OPTIMIZERS.get(spec.name).build
    if cls is None:
        return None
    kwargs = {k: v for k, v in asdict(spec).items() if k != "name"}
    return cls(trainable(spec, model), **kwargs)


def trainable(spec, model: nn.Module) -> list[nn.Parameter]:
    """``model``'s parameters the optimizer ``spec`` trains: refused when it would train none (the gate
    asks the model built on the meta device; a model built only for the run is asked here)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params and spec.name != "none":
        raise ConfigError(f"optimizer: '{spec.name}' but the model has no trainable parameters")
    return params


@dataclass(frozen=True)
class EvalSchedule:
    """After every ``every`` training steps (0 = never), the same ``steps`` held-out batches without gradients."""

    every: int = 0
    steps: int = 1

    def held_out(self, data: Iterator[Batch]) -> list[Batch]:
        """The eval set: the first ``steps`` batches of ``data``, the same at every eval."""
        return list(itertools.islice(data, self.steps)) if self.every else []

    def due(self, step: int) -> bool:
        """Whether eval passes follow training step ``step`` (steps count from 0)."""
        return self.every > 0 and (step + 1) % self.every == 0


Forward = Callable[[torch.Tensor], object]


def train_step(forward: Forward, model: nn.Module, batch: Batch, loss_fn: LossFn | None,
               session: HookSession, optimizer: torch.optim.Optimizer | None,
               classifies: bool = False, gradients: bool = True) -> tuple[float | None, float | None]:
    """One forward (and, with a loss and ``gradients``, backward) pass; the optimizer steps after the hooks ran.

    ``forward`` is the model or its compiled wrapper; ``model`` owns the parameters. Returns the
    loss and, when ``classifies``, the batch's accuracy before the optimizer step.
    """
    model.zero_grad(set_to_none=True)
    if not gradients and loss_fn is not None:  # a measurement pass: the loss without its graph
        with torch.no_grad():
            out = first_tensor(forward(batch.x))
            accuracy = correct(out, batch.targets) / len(batch.targets) if classifies else None
            return float(loss_fn(out, batch.targets)), accuracy
    if loss_fn is None:
        with torch.no_grad():
            forward_until_stop(forward, batch.x)  # ``stop_after`` may end it early
        return None, None
    out = first_tensor(forward(batch.x))
    loss = loss_fn(out, batch.targets)
    accuracy = correct(out, batch.targets) / len(batch.targets) if classifies else None
    session.backward(loss)
    if optimizer is not None:
        optimizer.step()
    return float(loss.detach()), accuracy


def eval_passes(forward: Forward, model: nn.Module, held_out: list[Batch], loss_fn: LossFn | None,
                classifies: bool = False, recorder=None) -> tuple[float | None, float | None]:
    """Run the held-out batches in eval mode without gradients; return their mean loss and (when
    ``classifies``) the accuracy over all their samples. Run inside ``AttachedRun.evaluating()``,
    which labels their captures phase ``eval``, so they never mix with the training step's rows.
    ``recorder``: given each held-out batch's sample ids while it runs (``Recorder.samples``), the
    training batch's again after."""
    was_training = model.training
    model.eval()
    losses, right, total = [], 0, 0
    training_samples = recorder.samples if recorder is not None else None
    try:
        with torch.no_grad():
            for batch in held_out:
                if recorder is not None:
                    recorder.samples = batch.samples
                out = forward(batch.x)
                if loss_fn is not None:
                    losses.append(float(loss_fn(first_tensor(out), batch.targets)))
                if classifies:
                    right, total = right + correct(first_tensor(out), batch.targets), total + len(batch.targets)
    finally:
        model.train(was_training)
        if recorder is not None:
            recorder.samples = training_samples
    return statistics.fmean(losses) if losses else None, right / total if total else None
