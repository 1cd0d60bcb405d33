"""Reading a run directory's ``manifest.json``: the one reader every part of the runner uses.

The manifest is renamed into place last (``runner.store.commit``), so it is there only for a
committed run. ``read_manifest`` says so with ``None``; a manifest that is there but is not a
JSON object (a truncated copy, a file another tool overwrote) is a ``ManifestError`` naming it,
which each caller turns into its own terms (a damaged run for the loaders, a bad ``replay=``).
"""
from __future__ import annotations

import json
from pathlib import Path

from common.records import MANIFEST

__all__ = ["MANIFEST", "ManifestError", "read_manifest"]


class ManifestError(ValueError):
    """A ``manifest.json`` that is there but cannot be read as a JSON object; ``str`` is one line naming it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def read_manifest(run_dir: str | Path) -> dict | None:
    """The manifest of the committed run in ``run_dir``, or ``None`` when there is none.

    Raises:
        ManifestError: the file is there but is not a JSON object.
        OSError: the file is there but cannot be read (no permission, an I/O error).
    """
    path = Path(run_dir) / MANIFEST
    try:
        text = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        manifest = json.loads(text)
    except ValueError as exc:  # a truncated or overwritten manifest (bad UTF-8 included)
        raise ManifestError(path, f"not a JSON manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(path, f"not a JSON manifest (a {type(manifest).__name__}, not an object)")
    return manifest
