"""``Recording``: one ``runner.attach`` block opened and closed by a framework's events.

A framework's callback cannot hold a ``with`` block across its events; this holds it for them:
``open`` enters ``attach`` (the same checks, session and ``StepWriter``), ``close`` leaves it
(hooks removed, the run committed), ``abort`` leaves it with the framework's exception (hooks
removed, nothing final written). ``backward_begin``/``backward_end`` bracket the framework's own
``loss.backward()``; ``eval_begin``/``eval_end`` its validation passes (``AttachedRun.evaluating``);
``pause``/``resume`` leave other passes between training steps out.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import nn

from runner.engine.attach import AttachedRun, Hooks, attach
from runner.live.channel import Sink


class Recording:
    """The arguments of ``runner.attach`` (but the model), kept until the framework starts training."""

    def __init__(self, hooks: Hooks = (), overrides: Sequence[str] = (), out_dir: str | Path = "runs/attach",
                 **settings) -> None:
        self.arguments = {"hooks": dict(hooks) if isinstance(hooks, Mapping) else hooks, "overrides": list(overrides),
                          "out_dir": out_dir, **settings}
        self.run: AttachedRun | None = None
        self._block: contextlib.ExitStack | None = None
        self._backward: contextlib.ExitStack | None = None
        self._paused: bool | None = None  # whether the recorder recorded before ``pause``
        self._eval: contextlib.ExitStack | None = None
        self._eval_result = None

    def open(self, model: nn.Module, sinks: Mapping[str, Sink] | None = None) -> AttachedRun:
        """Attach the entries to ``model`` (a bad entry: one-line ``ConfigError``, nothing attached);
        ``sinks``: the trainer's own loggers, which the chosen live loggers of the same tool log through."""
        with contextlib.ExitStack() as block:
            self.run = block.enter_context(attach(model, sinks=sinks, **self.arguments))
            self._block = block.pop_all()
        return self.run

    def backward_begin(self) -> None:
        """The framework is about to call ``loss.backward()``."""
        self._backward = contextlib.ExitStack()
        self._backward.enter_context(self.run.backward_pass())

    def backward_end(self) -> None:
        """The framework's ``loss.backward()`` returned."""
        backward, self._backward = self._backward, None
        backward.close()

    def eval_begin(self) -> None:
        """The framework starts validation passes: recorded as eval passes of the step that ended
        (before the first step, as in a sanity check, they are left out)."""
        if self.run is None or self._eval is not None:
            return
        if self.run.index == 0:
            self.pause()
            return
        self._eval = contextlib.ExitStack()
        self._eval_result = self._eval.enter_context(self.run.evaluating())

    def eval_end(self, loss: float | None = None, **metrics: float) -> None:
        """The validation passes ended: their ``split=eval`` row gets ``loss`` and ``metrics``."""
        block, self._eval = self._eval, None
        if block is None:
            self.resume()
            return
        self._eval_result.set(loss, **metrics)
        block.close()

    def pause(self) -> None:
        """Passes from here to ``resume`` are not training steps (validation, evaluation): not recorded."""
        if self.run is not None and self._paused is None:
            recorder = self.run.session.recorder
            self._paused = recorder.enabled
            recorder.set_enabled(False)

    def resume(self) -> None:
        """Record again; the paused passes leave nothing, not even their count of calls in the next step."""
        if self.run is not None and self._paused is not None:
            recorder = self.run.session.recorder
            recorder.drain()
            recorder.set_enabled(self._paused)
        self._paused = None

    def close(self) -> None:
        """Training ended: remove the hooks and commit the run."""
        block, self._block, self.run, self._backward, self._eval = self._block, None, None, None, None
        if block is not None:
            block.close()

    def abandon(self) -> None:
        """The training ended without its end event (it failed, and the framework has no event for that):
        remove the hooks and write nothing final, as ``abort`` does. Nothing to do once closed."""
        if self._block is not None:
            self.abort(RuntimeError("the training ended without its end event"))

    def abort(self, exc: BaseException) -> None:
        """Training failed with ``exc``: remove the hooks, write nothing final (the framework re-raises ``exc``)."""
        block, self._block, self.run, self._backward, self._eval = self._block, None, None, None, None
        if block is not None:
            block.__exit__(type(exc), exc, exc.__traceback__)
