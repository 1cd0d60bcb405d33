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
from hooks.errors import ConfigError, choice_error
from runner.data import batches
from runner.losses import first_tensor, get_loss
from runner.memory import PeakMemory
from runner.models import build_model
from runner.outputs import RunOutputs


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; ``cuda`` without a GPU is a config error."""
    if name not in ("auto", "cpu", "cuda"):
        raise choice_error("device", name, ("auto", "cpu", "cuda"), "device")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False; use device=cpu or auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def run(cfg: DictConfig, out_dir: str | Path, overrides: Sequence[str] = ()) -> Path:
    """Run ``cfg.steps`` forward/backward passes with the configured hooks; return ``out_dir``.

    Everything that can be checked without running is checked before the first forward pass
    (hook entries, loss, device, selectors), and nothing is written when a check fails.
    """
    hooks = build_hooks(OmegaConf.to_container(cfg.hooks, resolve=True) if cfg.get("hooks") is not None else {})
    loss_fn = get_loss(cfg.loss.name)
    if loss_fn is None:
        for hook in hooks:
            if hook.needs_backward:
                raise ConfigError(f"{hook.key}: '{hook.spec.type}' needs a backward pass but loss=none; "
                                  f"choose a loss (e.g. loss=sum) or drop the entry")
    steps = int(cfg.steps)
    if steps < 1:
        raise ConfigError(f"steps: {steps} must be at least 1")
    if cfg.mode not in ("train", "eval"):
        raise choice_error("mode", cfg.mode, ("train", "eval"), "mode")
    device = resolve_device(cfg.device)
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg.model).to(device).train(cfg.mode == "train")
    data = batches(cfg.data, cfg.model, int(cfg.seed), device)
    out_dir = Path(out_dir)
    peak = PeakMemory(device)
    with HookSession(model, hooks) as session:
        with RunOutputs(out_dir, OmegaConf.to_yaml(cfg, resolve=True), overrides) as outputs:
            for step in range(steps):
                batch = next(data)
                peak.reset()
                start = time.perf_counter()
                loss = _forward_backward(model, batch, loss_fn, session)
                captures = session.recorder.drain()
                wall = time.perf_counter() - start
                outputs.write_step(step, captures, loss, wall, peak.peak_bytes())
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
