"""``HookCallback``: ``runner.attach`` for a Lightning ``Trainer`` (``pip install hook-runner[lightning]``).

The entries are attached to the ``LightningModule`` when training starts (after the sanity
check), so layers are named as in it (``net.fc`` for ``self.net = ...``). Each training batch
is one step: the loss ``training_step`` returned, ``accuracy`` as logged with ``self.log``.
Lightning's own ``loss.backward()`` is bracketed by ``on_before_backward``/``on_after_backward``,
which is where ``run.backward`` does its work, so accumulated ``.grad`` is recorded before the
optimizer steps. Validation inside ``fit`` is recorded as the eval passes of the training step
before it (phase ``eval``, a ``split=eval`` row with the loss logged as ``eval_loss``, by
default ``val_loss``); the sanity check before training is not recorded. When
``fit`` ends the hooks are removed and the run is committed; on an exception they are removed
and nothing final is written. A live logger chosen with ``logger=`` logs through the trainer's
own logger of that tool when it has one (``TensorBoardLogger``, ``WandbLogger``, ``MLFlowLogger``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

from common.errors import choice_error
from runner.engine.attach import Hooks
from runner.integrations.recording import Recording
from runner.live.to_mlflow import MLflowSink
from runner.live.to_tensorboard import TensorBoardSink
from runner.live.to_wandb import WandbSink


class HookCallback(Callback):
    """Record ``hooks`` (as ``runner.attach`` takes them) during ``Trainer.fit`` into ``out_dir``.

    ``accuracy``: the name the module logs its batch accuracy under (``self.log(NAME, ...)``),
    recorded as ``steps.parquet``'s ``accuracy``; by default ``"accuracy"`` when it is logged.
    ``eval_loss``: the name validation logs its loss under, the ``loss`` of the eval rows.
    ``settings``: those of ``runner.attach`` (``seed``, ``on_silent``, ``sample``, ...).

    Example:
        >>> trainer = Trainer(max_steps=100, callbacks=[HookCallback(hooks=["clip", "stats"], out_dir="runs/pl")])
    """

    def __init__(self, hooks: Hooks = (), overrides: Sequence[str] = (), out_dir: str | Path = "runs/attach",
                 accuracy: str | None = None, eval_loss: str = "val_loss", **settings) -> None:
        self.recording = Recording(hooks, overrides, out_dir, **settings)
        self.accuracy = accuracy
        self.eval_loss = eval_loss

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recording.open(pl_module, trainer_sinks(trainer))

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self.recording.backward_begin()

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recording.backward_end()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        run = self.recording.run
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        run.step(loss if isinstance(loss, torch.Tensor) else None, accuracy=self._accuracy(trainer, run.index))

    def _accuracy(self, trainer: Trainer, step: int) -> float | None:
        """The batch accuracy the module logged; a name given but never logged is an error at step 0."""
        logged = trainer.callback_metrics
        name = self.accuracy or "accuracy"
        if name in logged:
            return float(logged[name])
        if self.accuracy is not None and step == 0:
            raise choice_error("HookCallback(accuracy=...)", name, list(logged) or ["(nothing logged)"], "logged metric")
        return None

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recording.eval_begin()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logged = trainer.callback_metrics.get(self.eval_loss)
        self.recording.eval_end(float(logged) if logged is not None else None)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recording.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.recording.abort(exception)


def trainer_sinks(trainer: Trainer) -> dict:
    """The trainer's own loggers as live-logger sinks by tool: a chosen ``logger=`` of that tool logs through them."""
    sinks = {}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            sinks["tensorboard"] = TensorBoardSink.adopt(logger.experiment)
        elif isinstance(logger, WandbLogger):
            sinks["wandb"] = WandbSink.adopt(logger.experiment)
        elif isinstance(logger, MLFlowLogger):
            sinks["mlflow"] = MLflowSink.adopt(logger.experiment, logger.run_id)
    return sinks
