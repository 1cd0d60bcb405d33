"""``custom`` (``hooks.types.custom``): a user's function and the PyTorch hook kind that registers it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES, HookSpec
from hooks.specs.callables import resolve_callable

#: Each hook kind's arguments, without and with ``with_kwargs`` (``None``: PyTorch has no such form).
SIGNATURES = {
    "forward_pre": ("(module, args)", "(module, args, kwargs)"),
    "forward": ("(module, args, output)", "(module, args, kwargs, output)"),
    "full_backward": ("(module, grad_input, grad_output)", None),
    "backward_pre": ("(module, grad_output)", None),
    "tensor": ("(grad)", None),
    "post_accumulate": ("(param)", None),
}
TARGETS = ("output", "params")
MODULE_HOOKS = ("forward_pre", "forward", "full_backward", "backward_pre")


@dataclass
class CustomSpec(HookSpec):
    fn: str = MISSING  #: the import path of your function (``mypkg.hooks.my_hook``)
    hook: str = "forward"  #: which PyTorch function registers it: ``forward_pre``, ``forward``, ``full_backward``, ``backward_pre``, ``tensor``, ``post_accumulate``
    target: str = "output"  #: with ``hook: tensor``: ``output`` (each output) or ``params`` (each parameter)
    params: Optional[list[str]] = None  #: with ``target: params``: only these parameter names (null: all of the module's own)
    with_kwargs: bool = False  #: PyTorch's ``with_kwargs``: ``fn`` gets (and may return) keyword arguments
    prepend: bool = False  #: PyTorch's ``prepend``: before the module's existing hooks (module hooks only)
    always_call: bool = False  #: PyTorch's ``always_call``: the forward hook runs even when forward raises

    def check(self, key: str) -> None:
        if self.hook not in SIGNATURES:
            raise choice_error(f"{key}.hook", self.hook, SIGNATURES, "hook kind")
        if self.target not in TARGETS:
            raise choice_error(f"{key}.target", self.target, TARGETS, "target")
        if self.target != "output" and self.hook != "tensor":
            raise ConfigError(f"{key}.target: only meaningful with hook=tensor (got hook={self.hook})")
        if self.with_kwargs and self.hook not in ("forward_pre", "forward"):
            raise ConfigError(f"{key}.with_kwargs: PyTorch passes kwargs to forward_pre and forward hooks only")
        if self.always_call and self.hook != "forward":
            raise ConfigError(f"{key}.always_call: PyTorch offers always_call for forward hooks only")
        if self.prepend and self.hook not in MODULE_HOOKS:
            raise ConfigError(f"{key}.prepend: PyTorch has no prepend for tensor or post-accumulate hooks; "
                              f"entries on one tensor fire in config order")
        param_hook = self.hook == "post_accumulate" or (self.hook == "tensor" and self.target == "params")
        if self.params is not None and not param_hook:
            raise ConfigError(f"{key}.params: only meaningful with hook=post_accumulate or hook=tensor target=params")
        if self.params is not None and not self.params:
            raise ConfigError(f"{key}.params: empty list; use null for every parameter or name some, e.g. [bias]")
        self.callable(key)

    def callable(self, key: str) -> Callable:
        """``fn`` imported and checked against the arguments PyTorch passes to this hook kind."""
        called_as = SIGNATURES[self.hook][self.with_kwargs]
        return resolve_callable(self.fn, f"{key}.fn", called_as.count(",") + 1, f"a {self.hook} hook {called_as}")


HOOK_TYPES.declare("custom", "hooks.types.custom", CustomSpec)
