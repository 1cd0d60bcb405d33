"""``HookCallback``: ``runner.attach`` for a Hugging Face ``transformers.Trainer``.

The ``Trainer`` has no event around its ``loss.backward()`` and none for an exception, so:

- passed as ``Trainer(callbacks=[HookCallback(...)])``, as every callback is, it attaches at
  ``on_train_begin`` and commits at ``on_train_end``. A training that fails in between never reaches
  ``on_train_end``: its hooks are removed and nothing final is written when the callback is collected
  (a finalizer: at once in a script that lets the exception end it, at the latest at exit), or when
  the next ``train()`` begins. Used as a context manager around ``trainer.train()``, leaving the
  block on an exception does that at once;
- what is recorded after backward (accumulated ``.grad``) is recorded as the optimizer steps
  (``HookSession.flush``): once per optimizer step, after gradient accumulation and after the
  ``Trainer``'s own clipping (``max_grad_norm``, 1.0 by default; 0 records ``.grad`` unclipped);
- forward calls that activation (gradient) checkpointing repeats in backward could not be told from
  forward calls, so that setting is refused.

A live logger chosen with ``logger=`` (``tensorboard``, ``wandb``, ``mlflow``) logs into the run the
Trainer's own reporting opened (``report_to``) when there is one: the event directory of its
``TensorBoardCallback``, the active W&B run, the active MLflow run (``reported_sinks``).

One optimizer step is one step; its loss is the mean of the ``loss`` the model returned for its
micro-batches (NaN when the model returns none). Evaluation and prediction between steps are not
recorded (the entries still act on them).
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, Sequence
import weakref
from pathlib import Path

import torch
from torch import nn
from transformers import TrainerCallback

from common.errors import ConfigError
from runner.engine.attach import Hooks
from runner.integrations.recording import Recording
from runner.live.channel import Deferred, WithoutMeasures
from runner.live.to_mlflow import MLflowSink
from runner.live.to_tensorboard import TensorBoardSink
from runner.live.to_wandb import WandbSink


class HookCallback(TrainerCallback):
    """Record ``hooks`` (as ``runner.attach`` takes them) during ``Trainer.train`` into ``out_dir``.

    Example:
        >>> Trainer(model=model, args=args, train_dataset=data,
        ...         callbacks=[HookCallback(hooks=["clip", "stats"], out_dir="runs/hf")]).train()
    """

    def __init__(self, hooks: Hooks = (), overrides: Sequence[str] = (), out_dir: str | Path = "runs/attach",
                 **settings) -> None:
        self.recording = Recording(hooks, overrides, out_dir, **settings)
        self._losses: list[float] = []
        # Nothing the model's hooks hold refers to the callback, so it is collected with the Trainer.
        weakref.finalize(self, self.recording.abandon)

    def __enter__(self) -> HookCallback:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.recording.abort(exc)
        else:
            self.recording.close()

    def on_train_begin(self, args, state, control, model: nn.Module | None = None, **kwargs) -> None:
        self.recording.abandon()  # a train() that failed before this one never reached on_train_end
        if not isinstance(model, nn.Module):
            raise ConfigError(f"HookCallback: the Trainer passed model={type(model).__name__}, not a torch.nn.Module")
        if getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing:  # the name since 5.x, before
            raise ConfigError("HookCallback: activation (gradient) checkpointing is not supported (the Trainer has no "
                              "event around backward to tell recomputed calls from forward ones); use runner.attach")
        run = self.recording.open(model, reported_sinks(args))
        run.session.add(model.register_forward_hook(functools.partial(_keep_loss, self._losses)))

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.recording.resume()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        run = self.recording.run
        losses = self._losses[:]
        self._losses.clear()
        run.step(sum(losses) / len(losses) if losses else None)
        self.recording.pause()  # evaluation, logging and saving until the next step

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.recording.close()


def _keep_loss(losses: list[float], module: nn.Module, args, output) -> None:
    """The loss of a training micro-batch, as the model returned it (not the rehearsal's, on meta)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if module.training and isinstance(loss, torch.Tensor) and not loss.is_meta:
        losses.append(float(loss.detach()))


def reported_sinks(args) -> dict:
    """The runs the Trainer's own reporting opened (``args.report_to``; its reporting callbacks come
    before this one, so they are open by this callback's ``on_train_begin``) as live-logger sinks by tool:
    a chosen ``logger=`` of that tool logs into them. Into TensorBoard and W&B the Trainer logs its own
    ``train/loss``: there the run's loss is left out (``WithoutMeasures``), its statistics go beside."""
    sinks = {}
    if "tensorboard" in args.report_to and (log_dir := tensorboard_dir(args)) is not None:
        sinks["tensorboard"] = WithoutMeasures(Deferred(functools.partial(TensorBoardSink.into, log_dir)))
    wandb = sys.modules.get("wandb")
    if "wandb" in args.report_to and wandb is not None and wandb.run is not None:
        sinks["wandb"] = WithoutMeasures(WandbSink.adopt(wandb.run))
    mlflow = sys.modules.get("mlflow")
    if "mlflow" in args.report_to and mlflow is not None and mlflow.active_run() is not None:
        sinks["mlflow"] = MLflowSink.adopt(mlflow.MlflowClient(), mlflow.active_run().info.run_id)
    return sinks


def tensorboard_dir(args) -> Path | None:
    """The event directory of the Trainer's ``TensorBoardCallback``, which hands its writer to no other
    callback: under ``TENSORBOARD_LOGGING_DIR``, else ``OUTPUT_DIR/runs`` (``DATE_HOST``, ``/TRIAL`` in a
    hyperparameter search), the directory of the newest event file (the one it made at ``on_train_begin``)."""
    root = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or Path(args.output_dir) / "runs").expanduser()
    newest = max(root.rglob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime, default=None)
    return newest.parent if newest is not None else None
