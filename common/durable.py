"""Durable files: whole under their final name or not there at all, the one way every file is written.

A file is written under a hidden temporary name in its own directory (``.NAME.tmp-PID``),
fsynced, then renamed over its final name (``os.replace``, atomic on POSIX); the rename itself
is durable once the directory is fsynced. A reader of the final name sees the old file or the
new one, whole, never a half. Temporary names hold ``TMP_MARK``, so whoever claims a directory
next finds and removes what a killed writer left. The file has the run's permissions, those of any
new file under its umask (``0o644`` under ``022``), whatever mode its writer gave it (safetensors
writes ``0o600``, ``mkstemp`` too): a colleague's tool reads a store as it reads the parquet files.

- ``replaced(path)``: yields the temporary path for any writer (json, safetensors, pyarrow);
  fsynced and renamed when the block ends, removed when it raises.
- ``staged(path)``: the same but left under its temporary name, for files a commit renames
  together later (``runner.store.commit``).
- ``sync_file(path)``: fsync a file another writer has closed (a streamed parquet file).
- ``fsync_dir(path)``: make the renames in a directory durable.

Every call goes through ``os.fsync`` / ``os.replace`` themselves, so a test that injects faults
there covers every durable write.
"""
from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = ".tmp-"


def tmp_path(path: Path) -> Path:
    """The hidden temporary sibling a file is written to before it is renamed to ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def sync_file(path: Path) -> os.stat_result:
    """fsync the file at ``path`` (written and closed by another writer); return its stat."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        return os.fstat(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make the renames in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged(path: Path) -> Iterator[Path]:
    """Yield ``path``'s temporary sibling to write; fsynced when the block ends, removed when it raises.

    The file stays under its temporary name: a commit renames it (``runner.store.commit``).
    """
    tmp = tmp_path(path)
    try:
        mode = _created(tmp)
        yield tmp
        os.chmod(tmp, mode)
        sync_file(tmp)
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def replaced(path: Path, sync_directory: bool = True) -> Iterator[Path]:
    """Yield ``path``'s temporary sibling to write; when the block ends it is fsynced and renamed to
    ``path`` (``sync_directory``: then the directory is fsynced, making this rename and every earlier
    one in it durable); when the block raises it is removed and ``path`` is left as it was.

    Example:
        >>> with replaced(Path("store.json")) as tmp:
        ...     tmp.write_text("{}")
    """
    path = Path(path)
    with staged(path) as tmp:
        yield tmp
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    if sync_directory:
        fsync_dir(path.parent)


def _created(tmp: Path) -> int:
    """Create ``tmp`` empty, as any new file of this process is created (``0o666`` less the umask), and
    return its mode: the run's permissions, read without changing the umask (another thread may be
    creating files)."""
    tmp.unlink(missing_ok=True)  # a killed writer's file of the same pid keeps its own mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _remove(tmp: Path) -> None:
    """Drop a temporary file after a failure; a file system that fails this too (read-only) leaves it
    to the next writer's clean-up, and the error that made the write fail is the one reported."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
