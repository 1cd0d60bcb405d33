"""``StepWriter``: one step's bookkeeping around any loop, the CLI's or the user's (``runner.attach``).

Before a step: the session's lifetimes and the recorder's sampling; its clock and peak memory
start. After it: its captures are drained, checked for NaN/Inf and handed to the writer with
one ``steps.parquet`` row (and, after it on the writer's thread, to the live loggers); after the first training step an entry that matched but recorded
nothing is said, or refused. One code path, so a user's loop writes the tables the CLI writes.
"""
from __future__ import annotations

import threading
import time
import warnings

import torch

from common.errors import ConfigError
from hooks import HookSession
from hooks.mechanism.recorder import StepCaptures
from runner.config.schema import RunConfig
from runner.engine.memory import PeakMemory, release_freed_memory
from runner.engine.nonfinite import NonFiniteGuard
from runner.live import LiveLoggers
from runner.store.outputs import RunOutputs


#: Steps between two returns of the heap's free pages to the OS (``release_freed_memory``). Each
#: costs ~40 ms after a resnet18 batch-8 step on this machine (madvise, then page faults when
#: the memory is used again); between two, a fragmented heap grows by ~0.4 MiB a step at most.
TRIM_EVERY = 4


class SilentEntryWarning(UserWarning):
    """An entry matched modules but recorded or changed nothing in the first step."""


class StepWriter:
    """``begin(step)``, ``start()`` before a step's work; ``finish(step, loss)`` after it."""

    def __init__(self, session: HookSession, outputs: RunOutputs, settings: RunConfig, device: torch.device,
                 live: LiveLoggers | None = None) -> None:
        self.session = session
        self.live = live
        self.recorder = session.recorder
        self.outputs = outputs
        self.every = settings.sample.every
        self.on_silent = settings.on_silent.value
        self.guard = NonFiniteGuard(settings.on_nonfinite.value)
        self.peak = PeakMemory(device)
        self.started = time.perf_counter()

    def begin(self, step: int) -> None:
        """Apply the entries' lifetimes for ``step`` and whether it is sampled (``sample.every``)."""
        self.session.begin_step(step)
        self.recorder.set_enabled(step % self.every == 0)

    def start(self) -> None:
        """The step's wall time and peak memory count from here."""
        self.peak.reset()
        self.started = time.perf_counter()

    def wait_written(self, timeout_s: float | None = None, sent: bool = True) -> bool:
        """Wait until every finished step is written and its live loggers' lines sent (``sent=False``:
        only offered to them); False if ``timeout_s`` passed first. A benchmark's way of charging each
        step with its own writing."""
        written = threading.Event()
        self.outputs.submit(written.set)
        return written.wait(timeout_s) and (not sent or not self.live or self.live.wait_sent(timeout_s))

    def finish(self, step: int, loss: float | None, split: str = "train", metrics: dict[str, float] | None = None) -> None:
        """Write the step (the recorder's captures, drained here, after what a backward left to
        record: ``HookSession.flush``); check silent entries after training step 0."""
        self.session.flush()
        _write_step(self, step, self.recorder.drain(), loss, split, metrics or {})
        if self.live:
            self.live.say_problems()
        if step == 0 and split == "train":
            report_silent(self.session, self.on_silent)


def _write_step(writer: StepWriter, step: int, captures: StepCaptures, loss: float | None, split: str,
                metrics: dict[str, float]) -> None:
    """Check and hand one step's captures to the writer; the step's wall time ends here.

    A function of its own so that no local variable holds a step's captures while the next step
    runs: measured here, that alone made resident memory grow by ~0.3 MiB a step (allocator
    fragmentation), where the 200-step capture test must stay flat.
    """
    wall = time.perf_counter() - writer.started
    writer.guard.check(step, captures, loss)
    writer.outputs.write_step(step, captures, loss, wall, split=split, peak_memory_bytes=writer.peak.peak_bytes(),
                              metrics=metrics)
    if writer.live:  # the live loggers' lines, made on the writer thread from what was just written
        live = writer.live
        writer.outputs.submit(lambda: live.offer(step, split, captures, loss, metrics))
    if step % TRIM_EVERY == 0:
        release_freed_memory()


def report_silent(session: HookSession, policy: str) -> None:
    """After the first step: an entry that matched but did nothing is said, or (``on_silent=error``) refused."""
    if policy == "ignore":
        return
    for silence in session.silent():
        message = (f"{silence.key} recorded no {silence.kind} on '{silence.layer or '(model)'}' in step 0: "
                   f"{silence.reason}")
        if policy == "error":
            raise ConfigError(f"{message} (on_silent=error; on_silent=warn records the run and says so)")
        warnings.warn(message, SilentEntryWarning, stacklevel=2)
