"""``OutputError``: the one-line error for a run directory that cannot be written."""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from common.errors import OutputError


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` from pyarrow or the OS into an ``OutputError`` naming ``path``."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(exc.errno or errno.EIO, f"cannot write '{path}': {describe(exc)}") from exc


def describe(exc: OSError) -> str:
    """The reason of an ``OSError`` without its file name (the message names the path itself)."""
    return os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
