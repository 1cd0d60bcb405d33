"""Which runs of a sweep the loaders read: the committed ones, whole; the rest said in one line.

A sweep is read while some of its jobs are still writing and after one of them broke. A job
still writing has no manifest yet (it is renamed into place last), so it is not read, and how
many such jobs there are is one warning line (``PendingRunsWarning``). A committed run is
damaged when its manifest is not a JSON object, or a file it lists is missing, or a listed
parquet file no longer has the size the manifest records and its footer cannot be read (a
truncated copy, a disk that filled under another tool). ``on_corrupt="error"`` (the default)
raises ``CorruptRunError``, one line naming the file; ``on_corrupt="skip"`` reads the other runs
and warns once, listing every file it skipped (``SkippedRunsWarning``). A run is skipped whole,
so every table of a sweep holds the same runs.
"""
from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import choice_error
from common.records import MANIFEST
from runner.store.commit import TMP_MARK
from runner.store.lock import LOCK
from runner.store.ranks import is_part

#: What the loaders do with a damaged run: raise (``error``) or read the others (``skip``).
ON_CORRUPT = ("error", "skip")
#: What the loaders read of a manifest; the rest (versions, provenance, lifetimes) is not kept
#: for each of a sweep's jobs: 10,000 whole manifests held 45 MiB beside a 15 MiB frame.
_KEPT = ("files", "overrides", "ranks")
#: Where a job ended without data (``runner.cli.execute.STATUS``); it is not pending.
_STATUS = "status.json"


class CorruptRunError(ValueError):
    """A committed run's manifest or listed file cannot be read; the message names the file."""


class PendingRunsWarning(UserWarning):
    """Jobs of a sweep that started and have not committed (or stopped without a word)."""


class SkippedRunsWarning(UserWarning):
    """Damaged runs ``on_corrupt="skip"`` left out."""


def read_manifest(run_dir: str | Path) -> dict:
    """The manifest of the committed run in ``run_dir``; ``CorruptRunError`` naming it when it is not JSON."""
    path = os.path.join(run_dir, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except ValueError as exc:  # a truncated or overwritten manifest
        raise CorruptRunError(f"{path}: not a JSON manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise CorruptRunError(f"{path}: not a JSON manifest (a {type(manifest).__name__}, not an object)")
    return manifest


def find_jobs(path: Path) -> tuple[list[Path], list[Path]]:
    """The run directories under ``path`` with a manifest, and the job directories still pending:
    started (Hydra's ``.hydra/``, a claim, a temporary file) with neither a manifest nor a status."""
    found, pending = [], []
    for root, dirs, files in os.walk(path):
        if MANIFEST in files:
            if not is_part(Path(root)):
                found.append(Path(root))
        elif _STATUS not in files and (".hydra" in dirs or LOCK in files or any(TMP_MARK in f for f in files)):
            pending.append(Path(root))
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return found, pending


def warn_pending(path: Path, pending: list[Path], complete: int) -> None:
    """One warning line: how many jobs under ``path`` have not committed, and what is read instead."""
    if pending:
        warnings.warn(f"{path}: {len(pending)} job(s) have not committed yet (still writing, or stopped without "
                      f"a status), e.g. '{pending[0]}'; reading the {complete} complete run(s)",
                      PendingRunsWarning, stacklevel=4)


def check_on_corrupt(on_corrupt: str) -> None:
    if on_corrupt not in ON_CORRUPT:
        raise choice_error("on_corrupt", on_corrupt, ON_CORRUPT, "policy")


def intact(runs: Iterable[Path], on_corrupt: str) -> tuple[dict[Path, dict], dict[str, pa.Schema]]:
    """What the loaders read of the manifests (``_KEPT``) of the ``runs`` that are whole, by run (a
    damaged one raises or is skipped: ``on_corrupt``), and the schemas of the files whose footers
    were read to tell (by absolute path), which the loaders need not read again."""
    check_on_corrupt(on_corrupt)
    whole, damaged, footers = {}, [], {}
    for run in runs:
        try:
            manifest = read_manifest(run)
            footers.update(_check_files(run, manifest))
        except CorruptRunError as exc:
            if on_corrupt == "error":
                raise CorruptRunError(f"{exc}; to read the other runs: on_corrupt='skip'") from None
            damaged.append(str(exc))
            continue
        whole[run] = {key: manifest[key] for key in _KEPT if key in manifest}
    if damaged:
        warnings.warn(f"skipped {len(damaged)} damaged run(s): {'; '.join(damaged)}", SkippedRunsWarning,
                      stacklevel=4)
    return whole, footers


def _check_files(run: Path, manifest: dict) -> dict[str, pa.Schema]:
    """``CorruptRunError`` naming the first file ``manifest`` lists that is missing or unreadable;
    else the schemas of the files whose footer was read (those of another size than committed)."""
    footers = {}
    for name, entry in (manifest.get("files") or {}).items():
        file = os.path.abspath(os.path.join(run, name))
        try:
            size = os.path.getsize(file)
        except OSError:
            raise CorruptRunError(f"{file}: listed in {MANIFEST} but missing") from None
        if name.endswith(".parquet") and size != (entry or {}).get("bytes"):
            try:  # another size than committed: whole only if its footer still reads
                footers[file] = pq.read_schema(file)
            except (pa.ArrowException, OSError) as exc:
                raise CorruptRunError(f"{file}: {size} bytes, {entry.get('bytes')} committed; not readable "
                                      f"({str(exc).splitlines()[0]})") from None
    return footers
