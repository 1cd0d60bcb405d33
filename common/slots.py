"""Slot naming: where each tensor of a module's inputs or outputs sits, by a dotted name (``"0"``,
``"1.hidden"``), and the same container with one slot replaced.

A slot names a tensor in the ``slot`` column of every table, in a ``units`` or ``store`` entry's
``slot`` key and in the losses that pick a model output's tensor, so one module names them for the
hooks, the losses and the readers alike. Imports nothing of ``hooks`` or ``runner``.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch


def walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(slot, tensor)`` for every tensor inside a module's inputs or outputs.

    Tuples and lists give their positions (``"0"``, ``"1"``), mappings their keys, nested
    containers dotted paths (``"0.hidden"``); a bare tensor is slot ``"0"``. Non-tensors are skipped.
    """
    if isinstance(obj, torch.Tensor):
        yield (prefix or "0"), obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from walk(item, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__")):
        for key in obj.keys():
            yield from walk(obj[key], f"{prefix}.{key}" if prefix else str(key))


def replace_slot(obj: Any, slot: str, new: torch.Tensor, prefix: str = "") -> Any:
    """``obj`` with the tensor ``walk`` calls ``slot`` replaced by ``new``. Only the containers on the
    way to it are rebuilt (tuples, named ones too, and lists by their type; mappings copied);
    everything else is the very object it was."""
    if isinstance(obj, torch.Tensor):
        return new if (prefix or "0") == slot else obj
    if isinstance(obj, (tuple, list)):
        children = [(f"{prefix}.{i}" if prefix else str(i), item) for i, item in enumerate(obj)]
        items = [replace_slot(item, slot, new, child) if _on_the_way(child, slot) else item for child, item in children]
        return type(obj)(*items) if isinstance(obj, tuple) and hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        copied = copy.copy(obj)
        for key in obj.keys():
            child = f"{prefix}.{key}" if prefix else str(key)
            if _on_the_way(child, slot):
                copied[key] = replace_slot(obj[key], slot, new, child)
        return copied
    return obj


def _on_the_way(child: str, slot: str) -> bool:
    return slot == child or slot.startswith(child + ".")
