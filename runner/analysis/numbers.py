"""A swept value as a reader writes it: ``0.00003``, never ``3e-05`` (Python's ``str`` and ``:g`` switch to
an exponent below 1e-4), on every line that names a job by its values."""
from __future__ import annotations

import numpy as np


def plain(value, spec: str = "") -> str:
    """A float formatted with ``spec`` (``str`` without one), in plain decimal where that would write an
    exponent: ``3e-05`` is ``0.00003``, ``1e+20`` is ``100000000000000000000``; any other value as ``str``."""
    if not isinstance(value, (float, np.floating)):
        return str(value)
    text = format(value, spec) if spec else str(value)
    return np.format_float_positional(value, trim="-") if np.isfinite(value) and "e" in text else text
