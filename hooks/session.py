"""``HookSession``: the one owner of every handle a run registers, removed on exit whatever happens."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import nn
from torch.utils.hooks import RemovableHandle

from hooks.recorder import Recorder

if TYPE_CHECKING:
    from hooks.base import HookType


class HookSession:
    """Attach built hook types to a model for the span of a ``with`` block.

    Handles are removed in reverse order of registration on exit, also when the forward pass,
    the backward pass or a hook raises, or on Ctrl-C, so the model leaves the block with exactly
    the hooks it had before. Tensor hooks that hooks register on activations during forward need
    no handle: they die with the autograd graph of that step.

    Example:
        >>> with HookSession(model, build_hooks(cfg.hooks)) as session:
        ...     loss = model(x).sum(); loss.backward(); session.after_backward()
        ...     captures = session.recorder.drain()
    """

    def __init__(self, model: nn.Module, hooks: Sequence[HookType], recorder: Recorder | None = None) -> None:
        self.model = model
        self.hooks = list(hooks)
        self.recorder = recorder or Recorder()
        self._handles: list[RemovableHandle] = []

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        """Take ownership of ``handle``; it is removed when the session closes."""
        self._handles.append(handle)
        return handle

    def __enter__(self) -> HookSession:
        try:
            for hook in self.hooks:
                hook.attach(self.model, self)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every handle, newest first, then let each hook release what else it holds."""
        while self._handles:
            self._handles.pop().remove()
        for hook in reversed(self.hooks):
            hook.close()

    def after_backward(self) -> None:
        """Let each hook record what exists only once backward is done (accumulated ``.grad``)."""
        for hook in self.hooks:
            hook.after_backward(self.recorder)
