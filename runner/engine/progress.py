"""A progress bar on the terminal for long runs; silent in pipes, log files and cluster jobs."""
from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

#: Runs of at most this many steps finish too fast for a bar to help.
MIN_STEPS = 5


def progress_bar(total: int, enabled: bool = True, stream: TextIO | None = None) -> tqdm:
    """A ``tqdm`` bar over ``total`` steps on ``stream`` (stdout), disabled unless it is a terminal.

    Example:
        >>> with progress_bar(steps, cfg.progress) as bar:
        ...     bar.set_postfix(loss=0.7, refresh=False); bar.update()
    """
    stream = stream or sys.stdout
    show = enabled and total > MIN_STEPS and stream.isatty()
    return tqdm(total=total, disable=not show, file=stream, unit="step", dynamic_ncols=True)
