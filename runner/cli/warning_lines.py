"""Warnings on the command line as one line each: ``warning: CATEGORY: message``.

Python's default format adds the file and line that warned and echoes that source line, which
names the runner's internals, not the user's mistake; the command line prints the message alone.
"""
from __future__ import annotations

import warnings


def one_line(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` without the location and the echoed source line."""
    return f"warning: {category.__name__}: {message}\n"


def one_line_warnings() -> None:
    """Print every warning of this process as one line (``python -m runner`` calls it first)."""
    warnings.formatwarning = one_line
