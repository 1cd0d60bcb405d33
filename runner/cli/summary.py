"""The few lines ``python -m runner`` prints when a run or a sweep has ended (``quiet=true``: none).

The text is ``runner.analysis.summary``'s, read back from the files just committed; the run is
complete before it is printed, so a summary that cannot be made is one warning, never a failure.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


def print_summary(path: str | Path, quiet: bool) -> None:
    """Print the summary of the complete run or sweep at ``path`` unless ``quiet``."""
    if quiet:
        return
    from runner.analysis.summary import summarize  # pandas is imported only when the run has ended
    from runner.analysis.sweep_jobs import IncompleteSweepWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IncompleteSweepWarning)  # the sweep's end names those jobs itself
            text = summarize(path)
    except (OSError, ValueError, KeyError) as exc:  # e.g. a sweep whose every job failed
        log.warning("no summary of '%s': %s", path, exc)
        return
    print(text)
