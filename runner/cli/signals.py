"""SIGTERM as an exception, so that an interrupted run cleans up as after Ctrl-C.

Python's default SIGTERM handler ends the process at once: no ``finally``, no ``__exit__``,
so temporary files stay behind and the handles of the hook session are never removed.
Schedulers (SLURM, Kubernetes, systemd) stop jobs with SIGTERM, so the CLI turns it into
``Terminated``, a ``SystemExit`` with the shell's status 143 (128 + 15).

Inside a submitit job (a sweep on Slurm) the handlers are submitit's and stay in place: it
ignores SIGTERM (Slurm's preemption sends it before USR2; ``scancel`` before SIGKILL), and on
USR2 (``signal_delay_s`` before the time limit, or on preemption) it calls the launcher's
``checkpoint``, requeues the job and exits; the requeued job resumes (``runner.store.resume``).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from runner.store.resume import in_scheduler_job


class Terminated(SystemExit):
    """The process received SIGTERM; exits with status 143 unless caught."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated``; the previous handler is restored after.

    Signal handlers can only be set from the main thread; elsewhere, and in a submitit job, the
    block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread() or in_scheduler_job():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def scheduler_state(exc: BaseException) -> str | None:
    """``timeout`` for submitit's refusal to requeue a job that timed out once too often, else ``None``."""
    if not in_scheduler_job():
        return None
    from submitit.core.utils import UncompletedJobError  # only in a submitit job, where it is loaded

    return "timeout" if isinstance(exc, UncompletedJobError) and "timed-out" in str(exc) else None
