"""A file's or folder's fingerprint, as a run's provenance records it and a replay compares it.

The data kinds take it of the bytes they read (``describe_bytes``: a file is read once per run),
the manifest's ``provenance`` of every file the data or the checkpoint names (``runner.store.provenance``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

#: Files up to this many bytes (all files of a folder together) are fingerprinted by their contents
#: (sha256); larger data by each file's size and modification time, which reading costs nothing.
HASH_LIMIT = 64 << 20


def describe_bytes(path: str | Path, raw: bytes) -> dict:
    """``describe_file`` of the one file at ``path`` from its contents ``raw``, read by the caller."""
    if len(raw) > HASH_LIMIT:
        return describe_file(path)  # size and modification time: nothing more is read
    return {"path": str(path), "sha256": hashlib.sha256(b"\0" + raw).hexdigest()[:16]}


def describe_file(path: str | None) -> dict | None:
    """``{"path", "sha256"}`` of a file or folder, or ``{"path", "size_mtime"}`` when it is larger than
    ``HASH_LIMIT``; ``{"path", "missing": True}`` when nothing is there; ``None`` for no path."""
    if not path:
        return None
    root = Path(str(path))
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root] if root.is_file() else []
    if not files:
        return {"path": str(path), "missing": True}
    digest = hashlib.sha256()
    if sum(p.stat().st_size for p in files) > HASH_LIMIT:
        for p in files:
            stat = p.stat()
            digest.update(f"{p.relative_to(root) if p != root else ''}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        return {"path": str(path), "size_mtime": digest.hexdigest()[:16]}
    for p in files:
        digest.update(f"{p.relative_to(root) if p != root else ''}\0".encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return {"path": str(path), "sha256": digest.hexdigest()[:16]}
