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
from hooks.recorder import Recorder
from runner.data import batches
from runner.losses import get_loss
from runner.models import build_model
from runner.outputs import RunOutputs
from runner.progress import progress_bar
from runner.scale import check_compilable, compiled, row_group_bytes, sample_config
from runner.train import EVAL_SEED_OFFSET, EvalSchedule, build_optimizer, eval_passes, optimizer_config, train_step


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
    """Run ``cfg.steps`` training or measurement steps with the configured hooks; return ``out_dir``.

    Everything that can be checked without running is checked before the first forward pass
    (hook entries, loss, optimizer, sampling, device, selectors), and nothing is written when a
    check fails.
    """
    hooks = build_hooks(OmegaConf.to_container(cfg.hooks, resolve=True) if cfg.get("hooks") is not None else {})
    loss_fn = get_loss(cfg.loss)
    optimizer_spec = optimizer_config(cfg.get("optimizer"))
    if loss_fn is None:
        for hook in hooks:
            if hook.needs_backward:
                raise ConfigError(f"{hook.key}: '{hook.spec.type}' needs a backward pass but loss=none; "
                                  f"choose a loss (e.g. loss=sum) or drop the entry")
        if optimizer_spec.name != "none":
            raise ConfigError(f"optimizer: '{optimizer_spec.name}' needs a loss to train on but loss=none")
    steps = int(cfg.steps)
    if steps < 1:
        raise ConfigError(f"steps: {steps} must be at least 1")
    if cfg.mode not in ("train", "eval"):
        raise choice_error("mode", cfg.mode, ("train", "eval"), "mode")
    schedule = EvalSchedule.from_config(cfg)
    sample = sample_config(cfg)
    budget = row_group_bytes(cfg)
    compile_model, show_progress = _flag(cfg, "compile", False), _flag(cfg, "progress", True)
    if compile_model:
        check_compilable(hooks)
    device = resolve_device(cfg.device)
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg.model).to(device).train(cfg.mode == "train")
    optimizer = build_optimizer(optimizer_spec, model)
    data = batches(cfg.data, cfg.model, int(cfg.seed), device)
    held_out = schedule.held_out(batches(cfg.data, cfg.model, int(cfg.seed) + EVAL_SEED_OFFSET, device))
    out_dir = Path(out_dir)
    with HookSession(model, hooks, Recorder(sample.batch, sample.channels, int(cfg.seed))) as session:
        forward = compiled(model) if compile_model else model
        recorder = session.recorder
        with RunOutputs(out_dir, OmegaConf.to_yaml(cfg, resolve=True), overrides, budget) as outputs, \
                progress_bar(steps, show_progress) as bar:
            for step in range(steps):
                recorder.enabled = sample.records(step)
                batch = next(data)
                start = time.perf_counter()
                loss = _explain_backward_hook_errors(hooks, train_step, forward, model, batch, loss_fn, session,
                                                     optimizer)
                outputs.write_step(step, recorder.drain(), loss, time.perf_counter() - start)
                if schedule.due(step):
                    recorder.enabled = True  # eval passes are rare: always recorded
                    start = time.perf_counter()
                    captures, eval_loss = eval_passes(forward, model, held_out, loss_fn, recorder)
                    outputs.write_step(step, captures, eval_loss, time.perf_counter() - start, split="eval")
                bar.set_postfix(loss=loss, refresh=False)
                bar.update()
    return out_dir


def _flag(cfg: DictConfig, key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} must be true or false")
    return value


def _explain_backward_hook_errors(hooks, fn, *args):
    """Turn PyTorch's in-place error under ``mechanism: module`` into a one-line fix."""
    try:
        return fn(*args)
    except RuntimeError as exc:
        culprits = [h.key for h in hooks if getattr(h.spec, "mechanism", None) == "module"]
        if "BackwardHookFunction" not in str(exc) or not culprits:
            raise
        raise ConfigError(f"{culprits[0]}.mechanism=module: PyTorch's full backward hook fails on a module "
                          f"whose output is then modified in place (e.g. by ReLU(inplace=True) or "
                          f"'out += identity'); use mechanism=tensor, which records the same gradients") from None

