"""``Channel``: one logger's thread, fed through a bounded queue; it never makes the run wait or fail.

The writer thread puts each step's line without waiting. A full queue (a logger slower than the
steps) skips its oldest waiting line: a dashboard that falls behind shows the newest steps, and the
run's last line is always the last one sent. The logger's thread opens the tool (``opener``:
``wandb.init``, an MLflow run: seconds, or a server that does not answer) and sends the lines; an
error there drops the line and the thread goes on with the next (a server back up receives the
rest). The first failure is kept for the run's thread to say once (``take_problem``), named by what
happened (a tool in a process of its own is asked: its process ended, its server unreachable);
``close`` waits for the last lines while the thread makes progress and ``summary`` then says how
many lines were not sent and why. ``close`` leaves the thread behind (a daemon) and ends the tool's
process once it has sent nothing for ``timeout_s``, or at once when the tool's process ended or its
server has been unreachable for ``UNREACHABLE_S``: a slow tool finishes, a dead one costs the run's
end seconds.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from runner.live.lines import LogLine

#: At the run's end: how long a tool's process or server may stay unreachable before it is given up.
UNREACHABLE_S = 2.0
#: At the run's end: how often a tool that is still sending is asked what happened to it.
CHECK_S = 0.5


class Sink(Protocol):
    """A tool's side of a channel: ``log`` one line, ``close`` at the run's end (``failed``: it raised)."""

    def log(self, line: LogLine) -> None: ...

    def close(self, failed: bool) -> None: ...


@runtime_checkable
class Tool(Sink, Protocol):
    """A sink in a process of its own (``ProcessSink``), which the opener only starts: ``open`` opens the
    tool on the channel's thread (it may hang: a ``wandb.init``, a server that does not answer),
    ``diagnosis`` says what happened to it (its process ended, its server is unreachable; None: nothing
    seen), ``abandon`` ends its process, opened or not."""

    def open(self) -> None: ...

    def diagnosis(self) -> str | None: ...

    def abandon(self) -> None: ...


class ToolError(RuntimeError):
    """An error a sink says as one line already (the tool's error type and first line, or what ended it)."""


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
    """The thread that sends ``name``'s lines to the sink ``opener`` returns (opened on that thread).

    Counts: ``offered`` lines put, ``sent`` the tool took, ``skipped`` replaced by newer ones while it
    fell behind (the oldest waiting), ``lost`` it could not take (it raised, never opened, or was given
    up at the run's end with them waiting)."""

    def __init__(self, name: str, opener: Callable[[], Sink], size: int, timeout_s: float) -> None:
        self.name = name
        self.size = size
        self.timeout_s = timeout_s
        self.offered = self.sent = self.skipped = self.lost = 0
        self.last_sent: int | None = None  # the step of the last line the tool took
        self._opener = opener
        self._sink: Sink | None = None
        self._waiting: deque[LogLine] = deque()
        self._changed = threading.Condition()  # guards the queue and the counts
        self._closing = False
        self._gave_up = False
        self._failure: str | None = None  # the first failure: said once on the run's thread, and in the summary
        self._told = False
        self._failed = False
        self._progress = time.monotonic()  # when the tool was opened or last took a line
        self._cpu_at_end: float | None = None  # the thread's CPU seconds, noted as it ends
        self._thread = threading.Thread(target=self._loop, name=f"logger-{name}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """The lines that will not reach the tool: skipped or lost."""
        return self.skipped + self.lost

    def put(self, line: LogLine) -> None:
        """Queue ``line``; when ``size`` lines wait already, skip the oldest of them (never waits)."""
        with self._changed:
            if len(self._waiting) >= self.size:
                self._waiting.popleft()
                self.skipped += 1
            self._waiting.append(line)
            self.offered += 1
            self._changed.notify_all()

    def wait_sent(self, timeout_s: float | None = None) -> bool:
        """Wait until every line queued so far was sent (or dropped); False if ``timeout_s`` passed first.
        A benchmark's way of charging each step with its own logging."""
        with self._changed:
            return self._changed.wait_for(lambda: self.sent + self.dropped >= self.offered, timeout_s)

    def cpu_seconds(self) -> float:
        """The CPU seconds this channel's thread has used (what the tool does on it: building and sending lines)."""
        if self._cpu_at_end is None:
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
            except ProcessLookupError:  # the thread ended since: it noted its total first
                pass
        return self._cpu_at_end

    def take_problem(self) -> str | None:
        """The first failure, once (None before it or after it was taken)."""
        if self._failure is None or self._told:
            return None
        self._told = True
        return self._failure

    def summary(self) -> str | None:
        """After ``close``: how many lines did not reach the tool and why (the first failure, else that
        it fell behind); a failure not yet said when every line was sent; None when all went well."""
        with self._changed:
            unsent, offered, skipped, last = self.offered - self.sent, self.offered, self.skipped, self.last_sent
        if not unsent:
            return self.take_problem()
        self._told = True
        cause = self._failure or "fell behind the run"
        of_them = f", {skipped} of them skipped while it fell behind" if skipped and self._failure else ""
        last_sent = "none was sent" if last is None else f"the last sent was step {last}"
        return f"{cause}: {unsent} of {offered} lines not sent{of_them} ({last_sent})"

    def close(self, failed: bool = False) -> None:
        """Send what is queued, then close the tool's run (``failed``: the run raised); give up once
        nothing was sent for ``timeout_s``, or once the tool's process ended or its server was
        unreachable for ``UNREACHABLE_S``: then the tool's process is ended, open or still opening."""
        self._failed = failed
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        started = time.monotonic()
        unreachable_since = None
        while True:
            self._thread.join(CHECK_S)
            if not self._thread.is_alive():
                return
            now = time.monotonic()
            why = self._sink.diagnosis() if isinstance(self._sink, Tool) else None
            unreachable_since = (unreachable_since or now) if why else None
            if why and now - unreachable_since >= UNREACHABLE_S:
                break
            if now - max(started, self._progress) > self.timeout_s:
                why = f"sent nothing for close_timeout_s={self.timeout_s:g} at the run's end"
                break
        self._give_up(why)

    def _give_up(self, why: str) -> None:
        """Count what still waits as lost, note ``why``, and end the tool's process (a hung thread's sink)."""
        with self._changed:
            self.lost += len(self._waiting)
            self._waiting.clear()
            self._gave_up = True
            self._changed.notify_all()
        self._fail(why)
        if isinstance(self._sink, Tool):
            self._sink.abandon()

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = why

    def _why(self, exc: Exception) -> str:
        """``exc`` named by what happened to the tool when it can say (its process ended, its server is
        unreachable), else by the error itself."""
        seen = self._sink.diagnosis() if isinstance(self._sink, Tool) else None
        return seen or (str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}: {first_line(exc)}")

    def _loop(self) -> None:
        try:
            sink = self._sink = self._opener()
            if isinstance(sink, Tool):
                if self._gave_up:  # the run ended before its process started
                    sink.abandon()
                sink.open()
            self._progress = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a tool that cannot start costs the run its log lines only
            self._fail(f"could not start: {self._why(exc)}")
            sink = None
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or self._closing)
                if not self._waiting:
                    break
                line = self._waiting.popleft()
            sent = False
            if sink is not None:
                try:
                    sink.log(line)
                    sent = True
                    self._progress = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - an unreachable server drops the line, not the run
                    if self._failure is None:  # the first failure is the one said; its diagnosis may probe a server
                        self._fail(self._why(exc))
            with self._changed:
                if sent:
                    self.sent += 1
                    self.last_sent = line.step
                else:
                    self.lost += 1
                self._changed.notify_all()
        if sink is not None:  # given up too: a process sink then only releases its pipes
            try:
                sink.close(self._failed)
            except Exception as exc:  # noqa: BLE001
                self._fail(f"could not close: {self._why(exc)}")
        self._cpu_at_end = time.thread_time()


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 300 characters: what a warning line can hold."""
    return (str(exc).strip().splitlines() or [""])[0][:300]
