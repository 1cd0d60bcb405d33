"""Two orders: a sweep's jobs and swept values as the command line wrote them, and names as a reader counts.

A sweep's jobs are numbered in the order Hydra's basic sweeper expands the command line (the
cartesian product of the value lists, each as written; a range ``range(0,4)`` counts up), and
their directories are those numbers. So job order *is* the command line's order, for numbers,
text, dicts and lists alike: ``in_job_order`` orders a frame's runs by it, and the loaders keep
it for the values each run was given. Sorting the values instead reorders what the user wrote:
``'hooks.clip={min:-1000,max:1000},{min:-0.01,max:0.01}'`` must read 1000 first.

``natural_key`` is for what has no job order: layer names (``transformer.h.2`` before
``transformer.h.10``), the numbered job directories themselves (0, 1, ..., 10, not 0, 1, 10, 2),
and decimals written inside text (``0.0001`` before ``0.01`` before ``1000``).
"""
from __future__ import annotations

import math
import re
from pathlib import PurePath
from typing import Any

import numpy as np

#: A number inside text, read as one (sign, decimals, exponent), where it stands alone: not after a
#: letter, digit or dot (``layer1.10`` is two counts, not 1.1), its ``-`` a sign only after a
#: separator (``{min:-0.01`` is negative, ``run-2`` is a count). Any other run of digits is a count.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])|\d+")


def natural_key(value: Any) -> tuple:
    """A sort key: numbers before text, numbers by value, text with each number in it read as a number.

    >>> sorted(["10", "2", "layer1.10", "layer1.2", "0.01", "1000", "0.0001"], key=natural_key)
    ['0.0001', '0.01', '2', '10', '1000', 'layer1.2', 'layer1.10']
    >>> sorted(["{min:-0.0001}", "{min:-1000}", "{min:-0.01}"], key=natural_key)
    ['{min:-1000}', '{min:-0.01}', '{min:-0.0001}']
    """
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return (0, float(value), ())
    text = str(value) if not isinstance(value, PurePath) else value.as_posix()
    number = _as_number(text)
    if number is not None:
        return (0, number, ())
    parts, at = [], 0
    for found in _NUMBER.finditer(text):
        if found.start() > at:
            parts.append((1, 0.0, text[at:found.start()]))
        parts.append((0, _as_number(found.group()), ""))
        at = found.end()
    if at < len(text):
        parts.append((1, 0.0, text[at:]))
    return (1, 0.0, tuple(parts))


def _as_number(text: str) -> float | int | None:
    """``text`` as a number when it is one (``7``, ``-0.01``, ``1e-3``), else ``None``; counts stay exact ints.

    ``inf`` and ``nan`` are words here: NaN would order nothing.
    """
    if text.isdigit():
        return int(text)
    try:
        number = float(text)
    except ValueError:
        return None
    return None if math.isnan(number) or text.strip().lstrip("+-").isalpha() else number


def natural_sorted(values) -> list:
    """``values`` sorted by ``natural_key``."""
    return sorted(values, key=natural_key)


def in_job_order(run_dirs) -> list:
    """The distinct runs of a frame's ``run_dir`` column in job order.

    The loaders' ``run_dir`` is a categorical whose categories are the runs in job order (a sweep's
    ``sweep.json``, else its numbered job directories); a plain column (frames concatenated by
    hand) falls back to its paths in natural order, which is job order for numbered directories.
    """
    present = set(run_dirs)
    categories = getattr(getattr(run_dirs, "cat", None), "categories", None)
    if categories is not None:
        return [run for run in categories if run in present]
    return natural_sorted(present)
