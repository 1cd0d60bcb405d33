"""One meta-device model per model config while a sweep's plans are compiled.

Each job's rehearsal (``runner.engine.rehearsal``) builds its model on the meta device, about a
third of compiling a plan, though the jobs of a sweep mostly share one model config. Inside
``shared_meta_models()`` the model built for a config is kept and rehearsed again by the next job
with that config: the rehearsal attaches its entries through a ``HookSession``, which removes
every hook it added, and sets the train/eval mode itself. A model is reused only when it is as it
was built (its modules, its parameters' shapes, dtypes and ``requires_grad``, no hook left on
it); one that an entry changed is built again. A model with a checkpoint is never shared
(loading one on the meta device replaces its parameters).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from runner.sources.models import build_model

_BUILT: ContextVar[dict[str, tuple[nn.Module, tuple]] | None] = ContextVar("meta_models", default=None)


@contextlib.contextmanager
def shared_meta_models() -> Iterator[None]:
    """Within: ``built_on_meta`` keeps the model of each config for the next rehearsal of that config."""
    token = _BUILT.set({})
    try:
        yield
    finally:
        _BUILT.reset(token)


def built_on_meta(model_cfg: DictConfig) -> nn.Module:
    """The model of ``model_cfg`` on the meta device, without its checkpoint: built, or the shared one."""
    built = _BUILT.get()
    key = None if built is None or model_cfg.get("checkpoint") else OmegaConf.to_yaml(model_cfg)
    if key is not None and key in built:
        model, state = built[key]
        if _state(model) == state:
            return model
    with torch.device("meta"):
        model = build_model(OmegaConf.merge(model_cfg, {"checkpoint": None}))
    if key is not None:
        built[key] = (model, _state(model))
    return model


def _state(model: nn.Module) -> tuple:
    """What a rehearsal must find as built: modules, parameters and buffers, and that no hook is attached."""
    modules = tuple((name, type(module)) for name, module in model.named_modules(remove_duplicate=False))
    tensors = tuple((name, tuple(t.shape), t.dtype, t.requires_grad)
                    for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers()))
    hooked = any(value for module in model.modules() for attr, value in vars(module).items()
                 if "hook" in attr and isinstance(value, dict))
    hooked = hooked or any(getattr(p, "_post_accumulate_grad_hooks", None) or getattr(p, "_backward_hooks", None)
                           for p in model.parameters())
    return modules, tensors, hooked
