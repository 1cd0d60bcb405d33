"""Settings for big runs: sampling of captures, the output memory budget, and ``torch.compile``.

Each is read and checked before anything runs, with the same one-line errors as the rest of
the config.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch
from omegaconf import DictConfig
from torch import nn

from hooks.base import HookType
from hooks.errors import ConfigError
from hooks.registry import typed_config


@dataclass
class SampleConfig:
    """``every``: record every k-th step (from step 0); of activations, ``batch``: the first n
    samples, ``channels``: n random channels (dim 1, ``hooks.recorder.sampled_channels``)."""

    every: int = 1
    batch: Optional[int] = None
    channels: Optional[int] = None

    def check(self) -> None:
        if self.every < 1:
            raise ConfigError(f"sample.every: {self.every} must be at least 1 (1 = every step)")
        for key in ("batch", "channels"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"sample.{key}: {value} must be at least 1, or null for all of them")

    def records(self, step: int) -> bool:
        """Whether hooks record at training step ``step``."""
        return step % self.every == 0


def sample_config(cfg: DictConfig) -> SampleConfig:
    spec = typed_config("sample", SampleConfig, cfg.get("sample") or {}, "sampling key")
    spec.check()
    return spec


def row_group_bytes(cfg: DictConfig) -> int:
    """``output.row_group_mb`` in bytes: what each output file may buffer before it writes."""
    mb = (cfg.get("output") or {}).get("row_group_mb", 64)
    if not isinstance(mb, (int, float)) or isinstance(mb, bool) or not mb > 0:
        raise ConfigError(f"output.row_group_mb: {mb!r} must be a positive number of MiB")
    return max(1, int(mb * (1 << 20)))


def check_compilable(hooks: Sequence[HookType]) -> None:
    """Refuse, before any pass, every entry whose hooks do not work under ``torch.compile``."""
    for hook in hooks:
        problem = hook.compile_problem
        if problem:
            raise ConfigError(f"{hook.key}: hook type '{hook.spec.type}' {problem}, which torch.compile "
                              f"does not support; use compile=false or drop the entry")


def compiled(model: nn.Module) -> nn.Module:
    """``torch.compile(model)``; call it only after every hook is registered on ``model``.

    Compilation happens at the first call, and hooks added after it are silently ignored
    (``torch._dynamo.config.skip_nnmodule_hook_guards``). The hooks stay on ``model``'s own
    modules, so layer names carry no ``_orig_mod.`` prefix.
    """
    return torch.compile(model)
