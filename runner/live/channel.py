"""``Channel``: one logger's thread, fed through a bounded queue; it never makes the run wait or fail.

The writer thread puts each step's line without waiting: a full queue (a logger slower than the
steps) drops the line. The logger's thread opens the tool (``opener``: ``wandb.init``, an MLflow
run: seconds, or a server that does not answer) and sends the lines; an error there drops the
line and the thread goes on with the next (a server back up receives the rest). The first
problem is kept for the run's thread to say once (``problem``); ``close`` waits for the last lines
while the thread makes progress, and leaves it behind (a daemon) once it has sent nothing for
``timeout_s`` (a dead server), so a slow tool finishes and a dead one costs the run's end ``timeout_s``.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from runner.live.lines import LogLine


class Sink(Protocol):
    """A tool's side of a channel: ``log`` one line, ``close`` at the run's end (``failed``: it raised).
    A tool in a process of its own (``ProcessSink``) also has ``abandon``: it is ended when it hangs."""

    def log(self, line: LogLine) -> None: ...

    def close(self, failed: bool) -> None: ...


class WithoutMeasures:
    """``sink`` without the step's loss and measures: for a trainer's own run, which logs its own loss
    under the same tag (Hugging Face's ``train/loss``, at its own step and averaged over its
    ``logging_steps``), where two series would mix under one name."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def log(self, line: LogLine) -> None:
        self.sink.log(line.without_measures())

    def close(self, failed: bool) -> None:
        self.sink.close(failed)


class Deferred:
    """The sink ``opener`` opens, opened with the first line: a trainer's tool reached by making something
    of its own in it (an event file in its directory) is left untouched when no logger of it was chosen."""

    def __init__(self, opener: Callable[[], Sink]) -> None:
        self.opener = opener
        self.sink: Sink | None = None

    def log(self, line: LogLine) -> None:
        if self.sink is None:
            self.sink = self.opener()
        self.sink.log(line)

    def close(self, failed: bool) -> None:
        if self.sink is not None:
            self.sink.close(failed)


class Channel:
    """The thread that sends ``name``'s lines to the sink ``opener`` returns (opened on that thread)."""

    def __init__(self, name: str, opener: Callable[[], Sink], size: int, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.dropped = 0
        self._opener = opener
        self._sink: Sink | None = None
        self._queue: queue.Queue[LogLine | None] = queue.Queue(maxsize=size)
        self._problem: str | None = None
        self._told = False  # the first problem is the one said; the later ones are counted in ``dropped``
        self._failed = False
        self._progress = time.monotonic()  # when the tool was opened or last took a line
        self._handled = threading.Condition()
        self._taken = 0  # lines queued so far
        self._done = 0   # lines sent or dropped so far by the thread
        self._cpu_at_end: float | None = None  # the thread's CPU seconds, noted as it ends
        self._thread = threading.Thread(target=self._loop, name=f"logger-{name}", daemon=True)
        self._thread.start()

    def put(self, line: LogLine) -> None:
        """Queue ``line``, or drop it when the queue is full (never waits)."""
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._drop(f"fell behind the run ({self._queue.maxsize} steps waiting to be sent)")
            return
        with self._handled:
            self._taken += 1

    def wait_sent(self, timeout_s: float | None = None) -> bool:
        """Wait until every line queued so far was sent (or dropped); False if ``timeout_s`` passed first.
        A benchmark's way of charging each step with its own logging."""
        with self._handled:
            return self._handled.wait_for(lambda: self._done >= self._taken, timeout_s)

    def cpu_seconds(self) -> float:
        """The CPU seconds this channel's thread has used (what the tool does on it: building and sending lines)."""
        if self._cpu_at_end is None:
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
            except ProcessLookupError:  # the thread ended since: it noted its total first
                pass
        return self._cpu_at_end

    def take_problem(self) -> str | None:
        """The first problem since the last call (each is handed over once)."""
        problem, self._problem = self._problem, None
        return problem

    def close(self, failed: bool = False) -> None:
        """Send what is queued, then close the tool's run (``failed``: the run raised); give up once
        nothing was sent for ``timeout_s``."""
        self._failed = failed
        started = time.monotonic()
        stalled = lambda: time.monotonic() - max(started, self._progress) > self.timeout_s  # noqa: E731
        end_sent = False
        while self._thread.is_alive() and not stalled():
            if not end_sent:
                try:
                    self._queue.put(None, timeout=0.1)
                    end_sent = True
                except queue.Full:
                    continue
            self._thread.join(0.1)
        if self._thread.is_alive():
            self._drop(f"sent nothing for close_timeout_s={self.timeout_s:g} at the run's end", count=self._queue.qsize())
            if hasattr(self._sink, "abandon"):  # a tool in a process of its own: ended, not left running
                self._sink.abandon()

    def _drop(self, why: str, count: int = 1) -> None:
        self.dropped += count
        if not self._told:
            self._problem, self._told = why, True

    def _loop(self) -> None:
        try:
            sink = self._sink = self._opener()
            self._progress = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a tool that cannot start costs the run its log lines only
            self._drop(f"could not start: {type(exc).__name__}: {first_line(exc)}", count=0)
            sink = None
        while (line := self._queue.get()) is not None:
            if sink is None:
                self.dropped += 1
            else:
                try:
                    sink.log(line)
                    self._progress = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - an unreachable server drops the line, not the run
                    self._drop(f"{type(exc).__name__}: {first_line(exc)}")
            with self._handled:
                self._done += 1
                self._handled.notify_all()
        if sink is not None:
            try:
                sink.close(self._failed)
            except Exception as exc:  # noqa: BLE001
                self._drop(f"could not close: {type(exc).__name__}: {first_line(exc)}", count=0)
        self._cpu_at_end = time.thread_time()


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 300 characters: what a warning line can hold."""
    return (str(exc).strip().splitlines() or [""])[0][:300]
