"""``.runner.lock``: which process owns a run directory, decided the same way from every host.

The claim is a small JSON file created with ``O_CREAT | O_EXCL`` (atomic on local file systems
and on NFS v3 and later) naming its owner: host, PID and start time. While the owner lives, a
thread touches the file every ``HEARTBEAT_S`` seconds. A claim is stale (its owner is gone) when

- it was made on this machine (same host name, boot id and PID namespace) and its PID is dead,
  or now belongs to a process that started later (a reused PID);
- it was made on another machine (or cannot be read) and has not been touched for
  ``STALE_AFTER_S`` seconds, measured on the file system's own clock (the mtime of a file made
  just now), so hosts whose clocks disagree still agree on the claim's age.

A stale claim is taken over; a live one is refused naming its host and PID.

Why not ``filelock``: its ``FileLock`` is ``flock``, which on NFS holds across hosts only where
the server's lock manager works (a ``nolock`` mount makes it local to each host), and it cannot
say who holds it; ``SoftFileLease`` takes over a claim only after watching it unchanged for a
whole lease on the contender's own clock, so a run after a crashed one would wait minutes.
"""
from __future__ import annotations

import errno
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from common.claim_record import STALE_AFTER_S, describe_holder, is_stale, machine, process_start, read_claim
from common.records import LOCK
from runner.store.errors import OutputError, naming

#: Seconds between two touches of a live claim.
HEARTBEAT_S = 30.0

#: Why no run claims a directory on Windows: there ``os.kill(pid, 0)`` (asking whether a claim's owner
#: lives) interrupts or ends that process, and a directory cannot be opened to fsync its renames.
WINDOWS = ("hook-runner does not run on Windows: its run-directory claim asks whether a process lives with "
           "os.kill(pid, 0), which on Windows interrupts that process, and its commit fsyncs directories, "
           "which Windows cannot open; use Linux, macOS or WSL")


class DirLock:
    """A held claim on a directory; ``release`` ends it. Use ``DirLock.acquire``."""

    def __init__(self, path: Path, record: dict) -> None:
        self.path = path
        self.token = record["token"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-dir-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, out_dir: Path, fs_now: Callable[[], float]) -> DirLock:
        """Claim ``out_dir`` (which exists), taking over a stale claim.

        Raises:
            OutputError: a live run holds it (the message names its host and PID), it cannot be written,
                or this is Windows.
        """
        if sys.platform == "win32":
            raise OutputError(errno.ENOTSUP, WINDOWS)
        path = out_dir / LOCK
        record = {**machine(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
                  "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": uuid.uuid4().hex}
        with naming(path):
            for _ in range(2):  # a stale claim is moved aside once, then the create is retried
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    _take_over_if_stale(out_dir, path, fs_now)
                    continue
                try:
                    os.write(fd, json.dumps(record).encode())
                except BaseException:
                    path.unlink(missing_ok=True)  # an empty claim would hold the directory until it ages
                    raise
                finally:
                    os.close(fd)
                return cls(path, record)
        raise busy_error(out_dir, describe_holder(read_claim(path)))

    def verify(self) -> None:
        """Raise ``OutputError`` if the claim is no longer ours (taken over after missed heartbeats)."""
        try:
            record = read_claim(self.path)
            holder = describe_holder(record)
        except FileNotFoundError:
            record, holder = None, f"no one: {LOCK} was removed"
        if record is None or record.get("token") != self.token:
            raise OutputError(errno.EBUSY, f"cannot write '{self.path.parent}': this run lost its claim of the "
                                           f"directory (now held by {holder}); nothing was committed")

    def release(self) -> None:
        """Stop the heartbeat and remove the claim if it is still ours.

        On a disk that turned read-only the claim stays: its process is gone when the next run
        looks, so that run takes it over (``_take_over_if_stale``).
        """
        self._stop.set()
        self._thread.join()
        try:
            if (read_claim(self.path) or {}).get("token") == self.token:
                self.path.unlink()
        except OSError:  # gone already, or a read-only disk
            pass

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # a file system that fails now fails the run's own writes, which report it


def _take_over_if_stale(out_dir: Path, path: Path, fs_now: Callable[[], float]) -> None:
    """Move a stale claim aside (one contender wins the rename) and delete it; raise if it is live.

    The claim moved is compared with the one judged stale: if another contender replaced it in
    between, it is put back (``link`` never replaces a newer claim) and this run is refused.
    """
    try:
        seen, mtime = path.read_bytes(), path.stat().st_mtime
    except FileNotFoundError:
        return
    record = read_claim(path)
    if not is_stale(record, lambda: fs_now() - mtime):
        raise busy_error(out_dir, describe_holder(record))
    aside = path.with_name(f"{LOCK}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another contender moved it first
    try:
        if aside.read_bytes() != seen:
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            raise busy_error(out_dir, describe_holder(read_claim(path) if path.exists() else None))
    finally:
        aside.unlink()


def busy_error(out_dir: Path, holder: str) -> OutputError:
    """The refusal of a directory that ``holder`` (``describe_holder``) is writing."""
    return OutputError(errno.EBUSY, f"cannot write '{out_dir}': a run is writing there: {holder}; "
                                    f"wait for it or choose another directory (a claim whose run died is taken "
                                    f"over: at once on the same host, after {STALE_AFTER_S:.0f} s without a "
                                    f"heartbeat from another host)")
