"""One order for every list of jobs, layers and values: numbers as numbers, text by its digit runs.

A sweep's job directories are ``0, 1, ..., 10``, its layers ``transformer.h.2`` and
``transformer.h.10``: sorted as text they read 0, 1, 10, 11, 2. ``natural_key`` sorts them as a
reader counts, in the report, the loaders' categories, ``patching_table`` and the plots' legends.
"""
from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

import numpy as np

_DIGITS = re.compile(r"(\d+)")


def natural_key(value: Any) -> tuple:
    """A sort key: numbers before text, numbers by value, text with each run of digits as a number.

    >>> sorted(["10", "2", "layer1.10", "layer1.2"], key=natural_key)
    ['2', '10', 'layer1.2', 'layer1.10']
    """
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return (0, float(value), ())
    text = str(value) if not isinstance(value, PurePath) else value.as_posix()
    return (1, 0.0, tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)))


def natural_sorted(values) -> list:
    """``values`` sorted by ``natural_key``."""
    return sorted(values, key=natural_key)
