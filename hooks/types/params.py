"""``post_accumulate``: ``Tensor.register_post_accumulate_grad_hook`` on parameters.

The hook runs after a parameter's ``.grad`` has been accumulated for this backward, once per
parameter, and records that ``.grad`` (kind ``param_grad``). ``op: sgd`` also applies the
update ``p -= lr * p.grad`` right there and frees ``.grad`` (the "optimizer in backward"
pattern). These hooks exist only for leaf tensors; naming a computed (non-leaf) tensor such as a
parametrized ``weight`` is an error. They fire under ``.backward()`` only, which is what the
runner calls.
"""
from __future__ import annotations

import torch
from torch import nn

from common.errors import ConfigError
from hooks.mechanism.base import HookType
from hooks.types.gradients import select_params
from hooks.mechanism.registry import register
from hooks.specs.params import PostAccumulateSpec


@register("post_accumulate")
class PostAccumulate(HookType):
    """Records (and with ``op: sgd`` applies) each parameter's accumulated gradient."""

    spec_class = PostAccumulateSpec

    needs_backward = True

    pytorch_hooks = "Tensor.register_post_accumulate_grad_hook on parameters"

    expected_kinds = frozenset({"param_grad"})

    def attach(self, model: nn.Module, session) -> None:
        modules = self.targets(model)
        self._reject_non_leaves(modules)
        for layer, pname, p in select_params(self, modules, self.spec.params):
            session.add(p.register_post_accumulate_grad_hook(self._hook(session.recorder, layer, pname)))

    def _reject_non_leaves(self, modules: list[tuple[str, nn.Module]]) -> None:
        for layer, module in modules:
            for pname in self.spec.params or ():
                value = getattr(module, pname, None)
                if isinstance(value, torch.Tensor) and not value.is_leaf:
                    raise ConfigError(f"{self.key}.params: '{layer}.{pname}' is computed in forward (not a leaf "
                                      f"tensor), and post-accumulate-grad hooks exist only for leaves; "
                                      f"name the parameters it is computed from")

    def _hook(self, recorder, layer: str, pname: str):
        sgd, lr = self.spec.op == "sgd", self.spec.lr

        def on_accumulated(p: torch.Tensor) -> None:
            recorder.record(p.grad, hook=self.name, layer=layer, phase="backward", kind="param_grad",
                            slot=pname, call=recorder.next_call((self.name, layer, pname)))
            if sgd:
                with torch.no_grad():
                    p.add_(p.grad, alpha=-lr)
                p.grad = None

        return on_accumulated
