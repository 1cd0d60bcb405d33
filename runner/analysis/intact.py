"""Which runs of a sweep the loaders read: the committed ones, whole; the rest said in one line.

A sweep is read while some of its jobs are still writing and after one of them broke. A job
still writing has no manifest yet (it is renamed into place last), so it is not read, and how
many such jobs there are is one warning line (``PendingRunsWarning``). A committed run is
damaged when its manifest is not a JSON object, or a file it lists is missing, or a listed
parquet file no longer has the size the manifest records and its footer cannot be read (a
truncated copy, a disk that filled under another tool); a run of several ranks is damaged when
one rank's part is (its ``rank-N/manifest.json`` or a file it lists). ``on_corrupt="error"`` (the
default) raises ``CorruptRunError``, one line naming the file; ``on_corrupt="skip"`` reads the other runs
and warns once, listing every file it skipped (``SkippedRunsWarning``). A run is skipped whole,
so every table of a sweep holds the same runs.
"""
from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from common.durable import TMP_MARK
from common.errors import choice_error
from common.job_status import STATUS  # where a job ended without data: it is not pending
from common.manifest import MANIFEST, ManifestError, read_manifest
from common.records import LOCK
from common.ranks import is_part, part_rank

#: What the loaders do with a damaged run: raise (``error``) or read the others (``skip``).
ON_CORRUPT = ("error", "skip")


class CorruptRunError(ValueError):
    """A committed run's manifest or listed file cannot be read; the message names the file."""


class PendingRunsWarning(UserWarning):
    """Jobs of a sweep that started and have not committed (or stopped without a word)."""


class SkippedRunsWarning(UserWarning):
    """Damaged runs ``on_corrupt="skip"`` left out."""


def find_jobs(path: Path) -> tuple[list[Path], list[Path]]:
    """The run directories under ``path`` with a manifest, and the job directories still pending:
    started (Hydra's ``.hydra/``, a claim, a temporary file) with neither a manifest nor a status."""
    found, pending = [], []
    for root, dirs, files in os.walk(path):
        if MANIFEST in files:
            if not is_part(Path(root)):
                found.append(Path(root))
        elif STATUS not in files and (".hydra" in dirs or LOCK in files or any(TMP_MARK in f for f in files)):
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


class Part(NamedTuple):
    """One file of the table the loaders read, from one rank's part of a run (rank 0 if not distributed)."""

    rank: int
    file: str  # absolute
    rows: int  # as committed (0 if the manifest does not say)
    schema: str | None  # the committed schema fingerprint, if the file still has its committed size


class Run(NamedTuple):
    """What the loaders keep of a whole run: its overrides and the parts of the table they read.

    Not the manifest: 10,000 jobs' manifests (even cut to their file lists) held more than the frame.
    """

    overrides: tuple[str, ...]
    parts: tuple[Part, ...]


def intact(runs: Iterable[Path], on_corrupt: str, table: str | None = None
           ) -> tuple[dict[str, Run], dict[str, pa.Schema]]:
    """The ``runs`` that are whole, by path, each with what the loaders need of it to read ``table``
    (a damaged one raises or is skipped: ``on_corrupt``), and the schemas of the files whose footers
    were read to tell (by absolute path), which the loaders need not read again.

    A run of several ranks is whole when each rank's part is: its manifest, and the files it lists.
    """
    check_on_corrupt(on_corrupt)
    whole, damaged, footers = {}, [], {}
    for run in runs:
        try:
            manifest = _manifest(Path(run), "gone since the run was found")
            parts = []
            for rank, folder, own in _parts(Path(run), manifest):
                committed = _check_files(folder, own, footers)
                file = None if table is None else os.path.abspath(os.path.join(folder, table))
                if file is not None and (table in committed or os.path.isfile(file)):  # unlisted: an old run
                    parts.append(Part(rank, file, *committed.get(table, (0, None))))
        except (CorruptRunError, ManifestError) as exc:
            if on_corrupt == "error":
                raise CorruptRunError(f"{exc}; to read the other runs: on_corrupt='skip'") from None
            damaged.append(str(exc))
            continue
        whole[str(run)] = Run(tuple(manifest.get("overrides") or ()), tuple(parts))
    if damaged:
        warnings.warn(f"skipped {len(damaged)} damaged run(s): {'; '.join(damaged)}", SkippedRunsWarning,
                      stacklevel=4)
    return whole, footers


def _parts(run: Path, manifest: dict) -> list[tuple[int, Path, dict]]:
    """``(rank, folder, manifest)`` of each part of ``run``: itself (rank 0, or the rank of a part read
    on its own), or each rank's part its manifest lists (``runner.store.ranks``), whose manifest must read."""
    ranks = manifest.get("ranks")
    if not ranks:
        return [(part_rank(run) or 0, run, manifest)]
    found = []
    for rank, part in ranks.items():
        own = _manifest(run / part, f"rank {rank}'s part, listed in {run / MANIFEST}, but missing")
        found.append((int(rank), run / part, own))
    return sorted(found, key=lambda part: part[0])


def _manifest(folder: Path, missing: str) -> dict:
    """``folder``'s manifest; ``CorruptRunError`` naming it, saying ``missing``, when it is not there."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise CorruptRunError(f"{folder / MANIFEST}: {missing}")
    return manifest


def _check_files(run: Path, manifest: dict, footers: dict[str, pa.Schema]) -> dict[str, tuple[int, str | None]]:
    """``CorruptRunError`` naming the first file ``manifest`` lists that is missing or unreadable;
    else, by name, each parquet file's committed rows and schema fingerprint (``None`` if its size
    is not the committed one: its footer, read to tell, is put in ``footers``)."""
    committed = {}
    for name, entry in (manifest.get("files") or {}).items():
        entry = entry or {}
        file = os.path.abspath(os.path.join(run, name))
        try:
            size = os.path.getsize(file)
        except OSError:
            raise CorruptRunError(f"{file}: listed in {MANIFEST} but missing") from None
        if not name.endswith(".parquet"):
            continue
        if size == entry.get("bytes"):
            fingerprint = entry.get("schema")
            committed[name] = (int(entry.get("rows", 0)), sys.intern(fingerprint) if fingerprint else None)
            continue
        try:  # another size than committed: whole only if its footer still reads
            footers[file] = pq.read_schema(file)
        except (pa.ArrowException, OSError) as exc:
            raise CorruptRunError(f"{file}: {size} bytes, {entry.get('bytes')} committed; not readable "
                                  f"({str(exc).splitlines()[0]})") from None
        committed[name] = (int(entry.get("rows", 0)), None)
    return committed
