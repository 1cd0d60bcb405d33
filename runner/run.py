"""``run(cfg, out_dir)``: one experiment, from a composed config to a complete run directory.

Plain code, no Hydra globals: tests call it with a config from Hydra's compose API, and the CLI
(``runner.cli``) calls it with the Hydra run directory.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from hooks import HookSession, build_hooks
from hooks.base import HookType
from hooks.errors import ConfigError, choice_error
from runner.data import batches
from runner.losses import LossFn, first_tensor, get_loss
from runner.models import build_model
from runner.nonfinite import NonFiniteGuard
from runner.outputs import RunOutputs, check_output_dir
from runner.validate import check_config


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; ``cuda`` without a GPU is a config error."""
    if name not in ("auto", "cpu", "cuda"):
        raise choice_error("device", name, ("auto", "cpu", "cuda"), "device")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False; use device=cpu or auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def check_hooks(cfg: DictConfig, overrides: Sequence[str] = ()) -> tuple[list[HookType], LossFn | None]:
    """Validate everything ``cfg`` says without a model; return the built hooks and the loss."""
    check_config(cfg, overrides)
    hooks = build_hooks(OmegaConf.to_container(cfg.hooks, resolve=True) if cfg.get("hooks") is not None else {})
    loss_fn = get_loss(cfg.loss.name)
    if loss_fn is None:
        for hook in hooks:
            if hook.needs_backward:
                raise ConfigError(f"{hook.key}: '{hook.spec.type}' needs a backward pass but loss=none; "
                                  f"choose a loss (e.g. loss=sum) or drop the entry")
    return hooks, loss_fn


def run(cfg: DictConfig, out_dir: str | Path, overrides: Sequence[str] = ()) -> Path:
    """Run ``cfg.steps`` forward/backward passes with the configured hooks; return ``out_dir``.

    Everything that can be checked without running is checked before the first forward pass
    (keys, hook entries, loss, device, data, the output directory, selectors), and nothing is
    written when a check fails. ``cfg.on_nonfinite`` decides what NaN/Inf in a step does.
    """
    hooks, loss_fn = check_hooks(cfg, overrides)
    device = resolve_device(cfg.device)
    out_dir = Path(out_dir)
    check_output_dir(out_dir, cfg.overwrite)
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg.model).to(device).train(cfg.mode == "train")
    data = batches(cfg.data, cfg.model, int(cfg.seed), device)
    guard = NonFiniteGuard(cfg.on_nonfinite)
    with HookSession(model, hooks) as session:
        with RunOutputs(out_dir, OmegaConf.to_yaml(cfg, resolve=True), overrides, cfg.overwrite) as outputs:
            for step in range(int(cfg.steps)):
                batch = next(data)
                start = time.perf_counter()
                loss = _forward_backward(model, batch, loss_fn, session)
                wall = time.perf_counter() - start
                captures = session.recorder.drain()
                guard.check(step, captures, loss)
                outputs.write_step(step, captures, loss, wall)
    return out_dir


def _forward_backward(model, batch, loss_fn, session: HookSession) -> float | None:
    model.zero_grad(set_to_none=True)
    if loss_fn is None:
        with torch.no_grad():
            model(batch.x)
        return None
    loss = loss_fn(first_tensor(model(batch.x)), batch.targets)
    loss.backward()
    session.after_backward()
    return float(loss.detach())
