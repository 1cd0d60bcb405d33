"""The run-directory claim's file (``.runner.lock``) read: who holds a directory, and whether that
process still lives, decided the same way from every host (see ``runner.store.lock``, which takes
and releases the claim). Read by the claim itself and by every reader of a sweep's record
(``common.sweep_format``), which tells a job still running from one whose process was killed.
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from common.records import LOCK

#: A claim from another host untouched this long (file system clock) belongs to a dead run.
STALE_AFTER_S = 300.0


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks since boot)`` of ``pid`` (Linux), to tell a zombie or a reused PID."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[19])


def process_start(pid: int) -> int | None:
    process = _process(pid)
    return None if process is None else process[1]


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def machine() -> dict:
    """What makes a PID meaningful: two containers may share a host name but not a PID namespace."""
    return {"host": socket.gethostname(), "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace()}


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that can still write (not a zombie waiting for its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    process = _process(pid)
    return process is None or process[0] != "Z"


def describe_holder(record: dict | None) -> str:
    """``process 123 on host 'n01' (since 2026-...)``, or what is known of an unreadable claim."""
    if record is None:
        return f"an unreadable claim ({LOCK})"
    return f"process {record.get('pid')} on host '{record.get('host')}' (since {record.get('started')}, {LOCK})"


def is_stale(record: dict | None, age_s: Callable[[], float]) -> bool:
    if record is not None and {k: record.get(k) for k in ("host", "boot_id", "pid_ns")} == machine():
        pid = int(record["pid"])
        return not _running(pid) or record.get("pid_start") not in (None, process_start(pid))
    return age_s() > STALE_AFTER_S


def read_claim(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None  # created but not yet (or never) written


def live_holder(out_dir: Path, fs_now: Callable[[], float]) -> str | None:
    """Who holds ``out_dir`` (see ``describe_holder``), or ``None`` when no live run does.

    ``fs_now`` gives the file system's current time; it is called only for a claim made elsewhere.
    """
    path = out_dir / LOCK
    try:
        record, mtime = read_claim(path), path.stat().st_mtime
    except FileNotFoundError:
        return None
    if is_stale(record, lambda: fs_now() - mtime):
        return None
    return describe_holder(record)
