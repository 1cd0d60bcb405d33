"""SIGTERM as an exception, so that an interrupted run cleans up as after Ctrl-C.

Python's default SIGTERM handler ends the process at once: no ``finally``, no ``__exit__``,
so temporary files stay behind and the handles of the hook session are never removed.
Schedulers (SLURM, Kubernetes, systemd) stop jobs with SIGTERM, so the CLI turns it into
``Terminated``, a ``SystemExit`` with the shell's status 143 (128 + 15).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(SystemExit):
    """The process received SIGTERM; exits with status 143 unless caught."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated``; the previous handler is restored after.

    Signal handlers can only be set from the main thread; elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
