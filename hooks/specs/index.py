"""``index``: the part of a tensor an edit may change; the rest stays bit for bit what it was.

An index is parsed once, when the entry is built, from

* a list of integers ``[3, 17]``: those channels (dim 1); a single integer is one channel;
* a NumPy-like string ``"..., 0:4"`` / ``":, 5"``: comma-separated parts, each ``...``, ``:``,
  ``a:b`` (``a:b:c``) or an integer (negative counts from the end).

It is checked against each tensor it meets (first in the meta-device rehearsal, so against the
planned shape): a part beyond the tensor's dims, an integer out of range or a slice that selects
nothing or reaches past the end is a one-line ``ConfigError`` naming ``hooks.NAME.index``, the
shape and the part, never a silently narrower edit.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.errors import ConfigError

if TYPE_CHECKING:  # parsed without torch (``hooks.specs``); applied to tensors by the hooks
    import torch


@dataclass(frozen=True)
class Index:
    """A parsed ``index``: ``parts`` as Python indexing takes them, ``text`` as the user wrote it."""

    parts: tuple
    text: str
    key: str

    def check(self, shape: torch.Size) -> None:
        """Refuse a part that does not fit ``shape`` (see the module docstring)."""
        fixed = [p for p in self.parts if p is not Ellipsis]
        if len(fixed) > len(shape):
            self._fail(shape, f"{len(fixed)} indexed dims for a tensor of {len(shape)}")
        leading = self.parts.index(Ellipsis) if Ellipsis in self.parts else len(self.parts)
        dims = list(range(leading)) + list(range(len(shape) - (len(fixed) - leading), len(shape)))
        for dim, part in zip(dims, fixed):
            size = shape[dim]
            if isinstance(part, int) and not -size <= part < size:
                self._fail(shape, f"{part} is out of range for dim {dim} (size {size})")
            if isinstance(part, list) and any(not -size <= i < size for i in part):
                self._fail(shape, f"{part} has a channel out of range for dim {dim} (size {size})")
            if isinstance(part, slice):
                if (part.stop is not None and not -size <= part.stop <= size) or not range(size)[part]:
                    self._fail(shape, f"'{_slice_text(part)}' selects nothing or reaches past dim {dim} (size {size})")

    def apply(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``old`` with the indexed part taken from ``new`` (gradients flow to both parts)."""
        self.check(old.shape)
        out = old.clone()
        out[self.parts] = new[self.parts]
        return out

    def _fail(self, shape: torch.Size, what: str) -> None:
        raise ConfigError(f"{self.key}: {self.text!r} does not fit a tensor of shape {list(shape)}: {what}")


def _slice_text(part: slice) -> str:
    text = f"{'' if part.start is None else part.start}:{'' if part.stop is None else part.stop}"
    return text + (f":{part.step}" if part.step is not None else "")


def parse_index(value: Any, key: str) -> Index | None:
    """The ``Index`` of an ``index`` value (``None``: the whole tensor); ``key`` names it in errors."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} is not an index; give channels [3, 17] or a slice '..., 0:4'")
    if isinstance(value, int):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise ConfigError(f"{key}: {list(value)} must be a non-empty list of channel numbers, e.g. [3, 17]")
        return Index((slice(None), list(value)), str(list(value)), key)
    if not isinstance(value, str):
        raise ConfigError(f"{key}: {value!r} is not an index; give channels [3, 17] or a slice '..., 0:4'")
    parts = tuple(_part(p.strip(), value, key) for p in value.split(","))
    if parts.count(Ellipsis) > 1:
        raise ConfigError(f"{key}: {value!r} has more than one '...'")
    return Index(parts, value, key)


def _part(text: str, whole: str, key: str):
    if text == "...":
        return Ellipsis
    try:
        if ":" not in text:
            return int(text)
        numbers = text.split(":")
        if len(numbers) > 3:
            raise ValueError
        bounds = [int(n) if n.strip() else None for n in numbers]
    except ValueError:
        raise ConfigError(f"{key}: '{text}' in {whole!r} is not '...', an integer or a slice a:b[:c] "
                          f"(e.g. '..., 0:4' or ':, 5')") from None
    if len(bounds) == 3 and bounds[2] is not None and bounds[2] < 1:
        raise ConfigError(f"{key}: '{text}' in {whole!r}: a slice step must be at least 1")
    return slice(*bounds)


def narrowed(edit: Callable | None, index: Index | None) -> Callable | None:
    """``edit`` changing only the ``index``ed part of its first argument (as is without an index)."""
    if edit is None or index is None:
        return edit
    return lambda x, *rest: index.apply(x, edit(x, *rest))
