"""``ProcessSink``: a logger's tool run in a process of its own, at a lower CPU priority once it is open.

A tool's work in the run's process costs the step more than its CPU seconds: its Python holds the
GIL the hooks wait for (MLflow's SQL store: about 25 ms of Python a step for resnet18's 121 values,
which made the step 1.046 of ``stats`` alone in the run's process). In a process of its own
the run's process only pickles each line onto a pipe. The process imports the project's logging
part at normal priority (0.4 s: no torch, which only TensorBoard's sink imports), then opens the
tool and logs at ``TOOL_NICE`` (W&B's service, started by ``wandb.init``, inherits it): its wake-ups
yield to torch's threads, yet it keeps up with a run that keeps every core busy (``SCHED_IDLE``
sent nothing in 80 resnet18 steps, nice 19 fell behind).
Each call waits for the tool's answer, so ``Channel`` sees the tool's errors, its progress and its
hangs as it would on its own thread; the process is started before the tool is opened in it, so a
tool that hangs while opening is ended at the run's end like one that hangs later. ``diagnosis``
names a failure by what the run's side can see: the process's exit status, or the tool's server
refusing a connection.

The tool's process is ``python -c TOOL_SIDE FD``: requests on stdin, answers on file descriptor FD.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

from runner.live.channel import ToolError, first_line
from runner.live.lines import LogLine

#: The tool's process: ``serve`` (``sys.argv[1]``: its answers' file descriptor).
TOOL_SIDE = "from runner.live.process import main; main()"
#: The tool's niceness, from its opening on.
TOOL_NICE = 10
#: How long a connection to a tool's server may take before the server counts as unreachable.
PROBE_TIMEOUT_S = 2.0
#: ``prctl``'s option: the signal a process gets when the thread that started it ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1


class ToolProcessError(ToolError):
    """The tool's process raised (its error's type and first line), or ended."""


class ProcessSink:
    """The sink of logger ``name``, made as ``LOGGERS.get(name).build(cfg, context)`` in a new process.

    Made, it has started the process; ``open`` opens the tool there (on the channel's thread, where
    it may hang), so that the run's end can end a process that never finished opening."""

    def __init__(self, name: str, cfg, context) -> None:
        self.request = (name, cfg, context)
        self.abandoned = False
        self.server = cfg.server()
        answers, answer_fd = os.pipe()
        path = os.pathsep.join(entry for entry in sys.path if entry)  # a script's own sys.path finds runner too
        self.process = subprocess.Popen([sys.executable, "-c", TOOL_SIDE, str(answer_fd)],
                                        stdin=subprocess.PIPE, pass_fds=(answer_fd,),
                                        env={**os.environ, "PYTHONPATH": path})
        os.close(answer_fd)
        self._answers = os.fdopen(answers, "rb")

    def open(self) -> None:
        """Open the tool in its process; when it cannot, the process is ended and the tool's error raised."""
        try:
            self._call("open", self.request)
        except BaseException:
            self.abandon()
            self._release()
            raise

    def log(self, line: LogLine) -> None:
        self._call("log", line)

    def close(self, failed: bool) -> None:
        try:
            self._call("close", failed)
        finally:
            self._release()

    def diagnosis(self) -> str | None:
        """What happened to the tool, as seen from here: its process ended (not by ``abandon``), or its
        server refuses or does not take a connection; None when neither (it may still be slow, or hang)."""
        if self.process.poll() is not None and not self.abandoned:
            return f"its tool process ended ({exit_status(self.process.returncode)})"
        if self.server is not None:
            refused = unreachable(self.server)
            if refused:
                return f"its server {self.server} is unreachable ({refused})"
        return None

    def abandon(self) -> None:
        """End the tool's process (it hangs: a dead server, or its tool could not start)."""
        self.abandoned = True  # its end is then no news: ``diagnosis`` does not say it
        self.process.kill()
        self.process.wait()

    def _release(self) -> None:
        """Close the pipes and wait for the process (ended, or ending on its stdin's end)."""
        with contextlib.suppress(BrokenPipeError):  # a line it never read, of a process that ended
            self.process.stdin.close()
        self._answers.close()
        self.process.wait()

    def _call(self, request: str, payload: Any) -> None:
        try:
            pickle.dump((request, payload), self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
            ok, said = pickle.load(self._answers)
        except (EOFError, BrokenPipeError) as exc:
            raise ToolProcessError(f"its tool process ended{_ended(self.process)}") from exc
        if not ok:
            raise ToolProcessError(said)


def _ended(process: subprocess.Popen) -> str:
    """`` (killed by SIGKILL)`` of a process whose pipe closed (given a moment to end), else nothing."""
    try:
        return f" ({exit_status(process.wait(1))})"
    except subprocess.TimeoutExpired:
        return ""


def exit_status(code: int) -> str:
    """A ``Popen.returncode`` in words: ``exit status 1``, ``killed by SIGKILL``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


def unreachable(url: str) -> str | None:
    """Why the server at ``url`` (``http://HOST:PORT``) takes no TCP connection within ``PROBE_TIMEOUT_S``
    (``Connection refused``, ``timed out``, a name that does not resolve); None when it takes one."""
    address = urlsplit(url)
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        socket.create_connection((address.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def serve(requests, answers) -> None:
    """Answer each request in ``requests`` with ``(ok, error line)`` on ``answers`` until ``close`` or the pipe ends."""
    from runner.config.registry import LOGGERS
    from runner.live.config import register_backends

    register_backends()
    sink = None
    while True:
        try:
            request, payload = pickle.load(requests)
        except EOFError:  # the run's process ended without closing: nothing more to send
            return
        try:
            if request == "open":
                name, cfg, context = payload
                os.nice(TOOL_NICE)
                sink = LOGGERS.get(name).build(cfg, context)
            elif request == "log":
                sink.log(payload)
            else:
                sink.close(payload)
            answer = (True, None)
        except Exception as exc:  # noqa: BLE001 - the run's side says it (``Channel``) and goes on
            answer = (False, f"{type(exc).__name__}: {first_line(exc)}")
        pickle.dump(answer, answers)
        answers.flush()
        if request == "close":
            return


def main() -> None:
    """The tool's side: serve the requests of stdin, answering on the file descriptor ``sys.argv[1]``;
    on Linux it is killed with the run's process (a tool hung on a dead server outlives no run)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with os.fdopen(int(sys.argv[1]), "wb") as answers:
        serve(sys.stdin.buffer, answers)
