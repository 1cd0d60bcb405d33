"""``on_nonfinite``: what a run does when NaN or Inf shows up in a capture or the loss.

The check reads the ``nan_count``/``inf_count`` columns that ``Recorder.drain`` has already moved
to the host for the whole step, so it costs no extra device synchronisation per layer. Rows are
in the order the hooks fired, so the first non-finite row is where the values first appeared
(forward before backward, and backward from the loss towards the input).

* ``error``: stop the run (nothing is written) naming the step and the first layer.
* ``warn``: record the values and warn once per run, naming the same.
* ``ignore``: record the values and say nothing.

NaN and Inf are always recorded as they are (NaN stays NaN in parquet, never null).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from hooks.mechanism.recorder import StepCaptures

POLICIES = ("error", "warn", "ignore")


class NonFiniteError(RuntimeError):
    """A run with ``on_nonfinite=error`` met NaN or Inf."""


class NonFiniteWarning(RuntimeWarning):
    """A run with ``on_nonfinite=warn`` met NaN or Inf (reported once per run)."""


def describe_nonfinite(step: int, captures: StepCaptures, loss: float | None) -> str | None:
    """One line naming the step and the first capture with NaN/Inf, or ``None`` if all is finite."""
    bad = np.flatnonzero(captures.stats.get("nan_count", np.zeros(0)) + captures.stats.get("inf_count", np.zeros(0)))
    if len(bad):
        i = int(bad[0])
        col = captures.columns
        layer = col["layer"][i] or "(model)"
        return (f"step {step}: non-finite values first appeared in hooks.{col['hook'][i]} at layer '{layer}' "
                f"({col['phase'][i]} {col['kind'][i]}, slot {col['slot'][i]}, call {col['call'][i]}): "
                f"{int(captures.stats['nan_count'][i])} NaN, {int(captures.stats['inf_count'][i])} Inf")
    if loss is not None and not math.isfinite(loss):
        outputs = "output" in captures.columns.get("kind", ())  # outputs recorded: more hooks would not say more
        where = ("the loss function likely made it (e.g. the log of a negative output)" if outputs
                 else "hook more layers (e.g. hooks=stats) to see where it starts")
        return f"step {step}: the loss is {loss} while every hooked tensor was finite; {where}"
    return None


class NonFiniteGuard:
    """Applies one ``on_nonfinite`` policy to each step of a run."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._warned = False

    def check(self, step: int, captures: StepCaptures, loss: float | None) -> None:
        """Raise, warn or pass according to the policy; called once per step after ``drain``."""
        if self.policy == "ignore" or (self.policy == "warn" and self._warned):
            return
        message = describe_nonfinite(step, captures, loss)
        if message is None:
            return
        if self.policy == "error":
            raise NonFiniteError(f"{message} (on_nonfinite=error; on_nonfinite=warn records them and goes on)")
        self._warned = True
        warnings.warn(f"{message}; later steps are not reported (see nan_count/inf_count)",
                      NonFiniteWarning, stacklevel=2)
