"""Tensors another run kept (``tensors.parquet``), read back for ``ablate`` and ``patch``.

Read with pyarrow alone, filtered to the layers asked for, once per entry: an intervention
taking its values from a stored run never reads the run's other tensors. Every problem with the
run (not a complete run, no kept tensor, not the layer asked for) is one ``ConfigError``
naming the entry's key, before the first step.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from common.errors import ConfigError
from common.records import MANIFEST, TENSORS  # a complete run's manifest is written last

#: A stored tensor's identity: (step, layer, call, slot).
StoredKey = tuple[int, str, int, str]



def check_run_dir(path: str, key: str) -> Path:
    """``path`` as a complete run that kept tensors, or a one-line error naming ``key``."""
    run = Path(path)
    if not (run / MANIFEST).is_file():
        raise ConfigError(f"{key}: '{path}' is not a complete run directory (no {MANIFEST})")
    if not (run / TENSORS).is_file():
        raise ConfigError(f"{key}: run '{path}' kept no tensor ({TENSORS} missing); record it with a capture "
                          f"entry on the layers to take values from, e.g. hooks=extract")
    return run


_SHARED: ContextVar[dict | None] = ContextVar("shared_reads", default=None)


@contextlib.contextmanager
def shared_reads() -> Iterator[None]:
    """Within: each read of a stored run is made once per file as it is (its inode, size and mtime) and
    what it asked for, and given again to the next entry asking the same (a sweep's check: every job's
    ``patch`` entry reads one clean run, about 6 ms a job). What was read is dropped on exit: a run reads afresh."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _shared(run: Path, what: tuple, read: Callable[[], object]) -> object:
    """``read()``, or within ``shared_reads`` what it gave for the same ``what`` of the same ``tensors.parquet``."""
    shared = _SHARED.get()
    if shared is None:
        return read()
    found = os.stat(run / TENSORS)
    key = (str(run.resolve()), found.st_ino, found.st_size, found.st_mtime_ns, *what)
    if key not in shared:
        shared[key] = read()
    return shared[key]


def stored_steps(path: str, kind: str, key: str) -> list[int]:
    """The steps of which the run at ``path`` kept forward ``kind`` tensors (of any layer): what a
    plan checks against its steps, from the spec alone (``patch``'s ``source_step``)."""
    run = check_run_dir(path, key)
    return list(_shared(run, ("steps", kind), lambda: _steps(run, kind)))


def _steps(run: Path, kind: str) -> list[int]:
    table = pq.read_table(run / TENSORS, columns=["step"], filters=[("kind", "=", kind), ("phase", "=", "forward")])
    return sorted(set(table.column("step").to_pylist()))


def stored_tensors(path: str, layers: list[str], kind: str, key: str) -> dict[StoredKey, torch.Tensor]:
    """The forward-pass ``kind`` tensors the run at ``path`` kept of ``layers``, by (step, layer, call, slot).

    A layer of which the run kept no such tensor is an error listing the layers it did keep.
    """
    run = check_run_dir(path, key)
    forward = [("kind", "=", kind), ("phase", "=", "forward")]
    present = _shared(run, ("layers", kind), lambda: sorted(set(
        pq.read_table(run / TENSORS, columns=["layer"], filters=forward).column("layer").to_pylist())))
    missing = [layer for layer in layers if layer not in present]
    if missing:
        raise ConfigError(f"{key}: run '{path}' kept no {kind} of layer '{missing[0]}'; it kept the {kind} of: "
                          f"{', '.join(present) or '(none)'}")
    return dict(_shared(run, ("tensors", kind, tuple(layers)), lambda: _tensors(run, layers, forward)))


def _tensors(run: Path, layers: list[str], forward: list) -> dict[StoredKey, torch.Tensor]:
    table = pq.read_table(run / TENSORS, columns=["step", "layer", "call", "slot", "tensor_shape", "tensor_values"],
                          filters=[*forward, ("layer", "in", list(layers))])
    values = table.column("tensor_values")
    ids = zip(*(table.column(c).to_pylist() for c in ("step", "layer", "call", "slot", "tensor_shape")))
    out: dict[StoredKey, torch.Tensor] = {}
    for i, (step, layer, call, slot, shape) in enumerate(ids):  # a row per kept tensor, its values as one array
        flat = np.array(values[i].values.to_numpy(zero_copy_only=False), dtype=np.float32)
        out[(step, layer, call, slot)] = torch.from_numpy(flat.reshape(shape))
    return out
