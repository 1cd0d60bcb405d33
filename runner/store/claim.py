"""Owning a run directory: refuse early (complete run, live run, read-only, full), then claim it.

``claim_run_dir`` is meant to run before anything else writes into the directory (the CLI calls
it before Hydra saves ``.hydra/``), so a run that is refused leaves the directory as it found it.
"""
from __future__ import annotations

import errno
import functools
import os
import shutil
import uuid
from pathlib import Path

from common.durable import sync_file
from common.errors import ConfigError
from common.manifest import MANIFEST, read_manifest
from runner.store.commit import recover
from runner.store.errors import OutputError, describe, naming
from common.claim_record import live_holder
from runner.store.lock import DirLock, busy_error

#: Free bytes below which a run is refused before it starts: room for the footers and the manifest.
MIN_FREE_BYTES = 64 << 10
_PROBE_BYTES = 4096
#: Not a ``.tmp-`` name: a probe is not a file of a run (tools watching for a run's files ignore it).
_PROBE_PREFIX = ".runner-probe-"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(directory: Path, out_dir: Path) -> float:
    """Write, fsync and delete a small file in ``directory``; return its mtime (the file system's clock).

    A read-only or full file system fails here, as the run would, but before anything is written.
    """
    path = directory / f"{_PROBE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(path, "xb") as f:
            f.write(bytes(_PROBE_BYTES))
        return sync_file(path).st_mtime
    except OSError as exc:
        raise OutputError(exc.errno or errno.EIO, f"cannot write '{out_dir}': {describe(exc)}") from exc
    finally:
        path.unlink(missing_ok=True)


def check_output_dir(out_dir: Path, overwrite: bool) -> None:
    """Fail before any work if a run cannot be written to ``out_dir``; create nothing.

    Raises:
        OutputError: ``out_dir`` (or its nearest existing parent) is not a writable directory, is
            full, or a live run holds it (the message names its host and PID).
        ConfigError: ``out_dir`` holds a complete run and ``overwrite`` is false.
    """
    out_dir = Path(out_dir)
    existing = _nearest_existing(out_dir)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(errno.EACCES, f"cannot write '{out_dir}': '{existing}' is not a writable directory")
    fs_now = functools.cache(lambda: _probe(existing, out_dir))
    holder = live_holder(out_dir, fs_now) if existing == out_dir else None
    if holder is not None:
        raise busy_error(out_dir, holder)
    refuse_complete_run(out_dir, overwrite)
    fs_now()
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise OutputError(errno.ENOSPC, f"cannot write '{out_dir}': {os.strerror(errno.ENOSPC)} "
                                        f"({free} bytes free, a run needs at least {MIN_FREE_BYTES})")


class CompleteRunError(ConfigError):
    """``out_dir`` holds a complete run and ``overwrite`` is false. The message names the command
    line's remedies; ``runner.attach`` and a sweep say it in their own terms from ``out_dir``."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(f"overwrite: '{out_dir}' already holds a complete run ({MANIFEST}); pass overwrite=true "
                         f"to replace it, or choose another hydra.run.dir")
        self.out_dir = out_dir


def refuse_complete_run(out_dir: Path, overwrite: bool) -> None:
    """``CompleteRunError`` when ``out_dir`` holds a complete run and ``overwrite`` is false: the one part
    of ``check_output_dir`` the command line asks before compiling (the rest waits for Hydra's callback)."""
    if (out_dir / MANIFEST).exists() and not overwrite:
        raise CompleteRunError(out_dir)


class RunClaim:
    """This process's claim of a run directory, from ``claim_run_dir`` until ``release``.

    ``run_id`` names the run the claim is for; ``RunOutputs`` writes it into the manifest, so
    ``committed`` can tell from the directory itself whether this run's manifest is there.
    """

    def __init__(self, out_dir: Path, overwrite: bool, lock: DirLock) -> None:
        self.out_dir = out_dir
        self.overwrite = overwrite
        self._lock = lock
        self.run_id = lock.token

    @property
    def committed(self) -> bool:
        """Whether this run's manifest is in place: the run is complete, whatever happened after."""
        try:
            return (read_manifest(self.out_dir) or {}).get("run_id") == self.run_id
        except (OSError, ValueError):
            return False

    def verify(self) -> None:
        """Raise ``OutputError`` unless this process still holds the directory."""
        self._lock.verify()

    def release(self) -> None:
        """Give the directory up (the files of a committed run stay)."""
        self._lock.release()

    def __enter__(self) -> RunClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_run_dir(out_dir: str | Path, overwrite: bool) -> RunClaim:
    """Check ``out_dir`` (see ``check_output_dir``), create it and claim it for one run.

    Nothing is created when a check fails. Once claimed, what a crashed run left there is
    cleaned up (``commit.recover``): an interrupted overwrite is rolled back or forward, temporary
    files are removed.

    Raises:
        ConfigError: a complete run is there and ``overwrite`` is false.
        OutputError: a live run holds it, or it cannot be written.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    missing = []
    parent = out_dir
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        with naming(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
        lock = DirLock.acquire(out_dir, functools.cache(lambda: _probe(out_dir, out_dir)))
        try:
            recover(out_dir)
            with naming(out_dir):
                for probe in out_dir.glob(f"{_PROBE_PREFIX}*"):  # left by a probe interrupted before its clean-up
                    probe.unlink(missing_ok=True)
            refuse_complete_run(out_dir, overwrite)  # a run may have completed there since the check
        except BaseException:
            lock.release()
            raise
    except BaseException:
        for path in missing:
            try:
                path.rmdir()
            except OSError:
                break  # no longer empty: something else writes there now
        raise
    return RunClaim(out_dir, overwrite, lock)

