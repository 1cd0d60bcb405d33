"""A rehearsal of one step on the meta device, with the real hooks attached.

Some mistakes show only while a pass runs: a residual added across a shape change, a hook that
returns a tensor of another shape, PyTorch's in-place error under ``mechanism: module``. On the
meta device a step computes nothing and allocates nothing, so ``run`` (and the sweep's early
checks, and ``plan=true``) rehearse it first: those mistakes fail as one-line ``ConfigError``s
before the real model is built or anything is written. A model that cannot be built or run on
the meta device (downloaded weights, data-dependent control flow) is simply not rehearsed.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from hooks import HookSession
from hooks.base import HookType
from hooks.errors import ConfigError
from hooks.recorder import Recorder
from runner.sources.data import batches
from runner.sources.losses import LossFn, first_tensor
from runner.sources.models import build_model


def meta_inputs(cfg: DictConfig) -> tuple[nn.Module, torch.Tensor]:
    """The configured model, built on the meta device (no checkpoint), and a meta batch."""
    with torch.device("meta"):
        model = build_model(OmegaConf.merge(cfg.model, {"checkpoint": None}))
    model.train(cfg.mode == "train")
    x = next(batches(cfg.data, cfg.model, int(cfg.seed), torch.device("cpu"))).x.to("meta")
    return model, x


def meta_step(model: nn.Module, x: torch.Tensor, hooks: Sequence[HookType], loss_fn: LossFn | None,
              recorder: Recorder) -> None:
    """Forward (and backward, when there is a loss) with ``hooks`` attached, recording into ``recorder``."""
    with HookSession(model, hooks, recorder) as session:
        if loss_fn is None:
            with torch.no_grad():
                model(x)
            return
        targets = torch.zeros(x.shape[0], dtype=torch.long, device="meta")
        loss_fn(first_tensor(model(x)), targets).backward()
        session.after_backward()


def explain_backward_hook_errors(hooks: Sequence[HookType], fn, *args):
    """Call ``fn``; turn PyTorch's in-place error under ``mechanism: module`` into a one-line fix."""
    try:
        return fn(*args)
    except RuntimeError as exc:
        culprits = [h.key for h in hooks if getattr(h.spec, "mechanism", None) == "module"]
        if "BackwardHookFunction" not in str(exc) or not culprits:
            raise
        raise ConfigError(f"{culprits[0]}.mechanism=module: PyTorch's full backward hook fails on a module "
                          f"whose output is then modified in place (e.g. by ReLU(inplace=True) or "
                          f"'out += identity'); use mechanism=tensor, which records the same gradients") from None


class _Shapes(Recorder):
    """Records nothing: a rehearsal needs the hooks to run, not their statistics."""

    def record(self, tensor, **_) -> None:
        pass


def rehearse(cfg: DictConfig, hooks: Sequence[HookType], loss_fn: LossFn | None) -> None:
    """Run one meta-device step; re-raise ``ConfigError``s, ignore what the meta device cannot do."""
    if not hooks or cfg.model.get("weights"):
        return
    try:
        model, x = meta_inputs(cfg)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - not buildable on meta: the real run reports its own errors
        return
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # ``print`` hooks print in the real run only
            explain_backward_hook_errors(hooks, meta_step, model, x, hooks, loss_fn, _Shapes())
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - e.g. data-dependent control flow that meta tensors cannot decide
        return
