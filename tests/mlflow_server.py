"""A real ``mlflow server`` on localhost for the ``tracking`` tests: a SQLite store in a temporary directory."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: How long the server may take to answer ``/health`` (its first start migrates the store: slow on a busy machine).
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(root: Path):
    """Start ``mlflow server`` storing under ``root``; yield ``(tracking_uri, process)``; stop it after."""
    port = free_port()
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its group: the server and its workers
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=5).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield uri, process
    finally:
        stop(process)
        log.close()


def stop(process: subprocess.Popen) -> None:
    """Kill the server and its uvicorn workers (killing the parent alone leaves a worker serving)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
