"""``BackgroundWriter``: run write jobs on one thread, in order, while the next step computes.

Parquet encoding and file writes release the GIL, so on a machine with a spare core they cost
the training loop almost nothing. The queue is bounded by the bytes its jobs hold (the captured
tensors), so a writer slower than the hooks makes ``submit`` wait instead of growing memory.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from runner.store.errors import OutputError

#: Bytes of queued jobs above which ``submit`` waits (one job is always accepted).
MAX_QUEUED_BYTES = 128 << 20


class BackgroundWriter:
    """One writer thread; the first error a job raises is re-raised by ``submit`` or ``close``.

    Example:
        >>> writer = BackgroundWriter()
        >>> writer.submit(lambda: sink.write(table), nbytes=table.nbytes)
        >>> writer.close()          # waits for every job; raises a job's error here
    """

    def __init__(self, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[[], None] | None, int]] = deque()
        self._queued = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="background-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        """Queue ``job``; wait while the queue holds more than ``max_bytes``."""
        with self._cond:
            while self._error is None and self._queued and self._queued + nbytes > self.max_bytes:
                self._cond.wait()
            self._raise_error()
            self._jobs.append((job, nbytes))
            self._queued += nbytes
            self._cond.notify_all()

    def close(self, discard: bool = False) -> None:
        """Finish every queued job (or drop them, when ``discard``) and stop the thread."""
        with self._cond:
            if discard:
                self._jobs.clear()
                self._queued = 0
            self._jobs.append((None, 0))
            self._cond.notify_all()
        self._thread.join()
        if not discard:
            self._raise_error()

    def _raise_error(self) -> None:
        """An ``OutputError`` (a file that cannot be written) as itself: one line naming the path;
        anything else (a bug) wrapped, so that its traceback says it happened on this thread."""
        if isinstance(self._error, OutputError):
            raise self._error
        if self._error is not None:
            raise RuntimeError(f"background write failed: {self._error!r}") from self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job, nbytes = self._jobs.popleft()
            if job is None:
                return
            try:
                if self._error is None:
                    job()
            except BaseException as exc:  # handed to the producer thread
                self._error = exc
            with self._cond:
                self._queued -= nbytes
                self._cond.notify_all()
