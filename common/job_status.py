"""A sweep job's ``status.json``: how the job ended, its overrides and its error; one writer, one reader.

The job writes it when it ends without a committed run's manifest saying so (``runner.cli.job_files``),
the Slurm launcher for a job the scheduler ended; the sweep's record reconciles from it and
``runner.analysis`` lists failed jobs by it. Written through the durable write (``common.durable``):
a reader finds the old status or the new one whole, never half of one, whatever killed the writer.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from common.durable import replaced

STATUS = "status.json"


class StatusError(ValueError):
    """A ``status.json`` that is there but not a JSON object (the message names the file)."""


def write_job_status(out_dir: str | Path, state: str, overrides: Sequence[str], error: str | None) -> Path:
    """Write ``out_dir``'s ``status.json`` (``state``: ``ok``, ``failed``, ``interrupted``, ...) and return its path."""
    path = Path(out_dir) / STATUS
    with replaced(path) as tmp:
        tmp.write_text(json.dumps({"status": state, "overrides": list(overrides), "error": error}, indent=2) + "\n")
    return path


def read_job_status(out_dir: str | Path) -> dict | None:
    """``out_dir``'s ``status.json``, or ``None`` when the job wrote none.

    Raises:
        StatusError: the file is there but unreadable or not a JSON object.
    """
    path = Path(out_dir) / STATUS
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StatusError(f"unreadable {path}: {exc}") from None
    if not isinstance(found, dict):
        raise StatusError(f"unreadable {path}: holds {type(found).__name__}, not a JSON object")
    return found


def job_dirs_with_status(path: str | Path) -> list[Path]:
    """The directories at or under ``path`` holding a ``status.json``, sorted."""
    return sorted(found.parent for found in Path(path).rglob(STATUS))
