"""The ways of running one training step that ``benchmarks.run`` times against each other.

Each variant owns its own copy of the model (same weights) with its hooks attached once, so the
timed call is exactly one forward+backward with that variant's hooks and its per-step work
(the runner's ``drain``, the hand-written hooks' one host sync, a parquet write).
"""
from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from hooks import HookSession, build_hooks
from runner.config.compose import compose_config
from hooks.mechanism.recorder import Recorder, StepCaptures
from runner.store.outputs import RunOutputs



@dataclass
class Variant:
    """A named step of ``model``; ``close`` releases hooks and files when the benchmark ends."""

    name: str
    what: str
    model: nn.Module
    step: Callable[[], None]
    close: Callable[[], None] = lambda: None


def preset(name: str) -> dict:
    """The ``hooks=NAME`` preset exactly as the runner composes it (for resnet18)."""
    return OmegaConf.to_container(compose_config([f"hooks={name}", "model=resnet18"]).hooks, resolve=True)


def leaves(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if next(m.children(), None) is None]


def make_variants(model: nn.Module, x: torch.Tensor, extract_layers: list[str]) -> list[Variant]:
    """Every variant of the step on a private copy of ``model``, hooks attached."""
    def fresh() -> nn.Module:
        return copy.deepcopy(model)

    return [
        bare(fresh(), x),
        noop_by_hand(fresh(), x),
        runner_noop(fresh(), x),
        stats_by_hand(fresh(), x),
        runner_hooks("runner stats", "the `stats` preset (every leaf, outputs + output gradients), drained per step",
                     fresh(), x, preset("stats")),
        clip_by_hand(fresh(), x),
        runner_hooks("runner clip", "the `clip` preset: every parameter's gradient clamped, its statistics and "
                     "what the clamp removed (`clipped`) recorded, drained per step", fresh(), x, preset("clip")),
        runner_hooks("runner clip (record: false)", "the `clip` preset with `record: false`: every parameter's "
                     "gradient clamped, nothing recorded", fresh(), x, quiet_clip()),
        extract_by_hand(fresh(), x, extract_layers),
        runner_hooks("runner extract (memory)", "the `extract` preset, tensors drained to memory per step",
                     fresh(), x, extract_preset(extract_layers)),
        runner_extract_parquet(fresh(), x, extract_layers),
        feature_extractor(fresh(), x, extract_layers),
    ]


def peer_variants(model: nn.Module, x: torch.Tensor) -> list[Variant]:
    """The tools a user would pick instead (``wandb.watch``), where installed, after a bare step of their own:
    they are timed apart from the hooks, since a tool's background process (wandb's) works on after its step
    returns, in whichever step runs next."""
    if not wandb_installed():
        return []
    # One W&B run per process: wandb.watch logs to the global ``wandb.run``.
    return [bare(copy.deepcopy(model), x, "bare (the peers' rounds)"), wandb_watch(copy.deepcopy(model), x, "gradients")]


def quiet_clip() -> dict:
    """The ``clip`` preset with ``record: false`` (``hooks.clip.record=false``)."""
    entries = preset("clip")
    entries["clip"]["record"] = False
    return entries


def extract_preset(layers: list[str]) -> dict:
    entries = preset("extract")
    entries["extract"]["layers"] = list(layers)
    return entries


def _train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = model(x).sum()
    loss.backward()
    return loss


def bare(model, x, name: str = "bare") -> Variant:
    return Variant(name, "forward + backward, no hooks", model, lambda: _train_step(model, x))


def noop_by_hand(model, x) -> Variant:
    """A forward hook on every leaf that registers a do-nothing hook on the output."""
    def on_grad(_grad):
        return None

    def on_forward(_module, _args, out):
        if out.requires_grad:
            out.register_hook(on_grad)

    handles = [m.register_forward_hook(on_forward) for m in leaves(model)]
    return Variant("no-op hooks by hand", "forward hook + output tensor hook on every leaf, doing nothing",
                   model, lambda: _train_step(model, x), lambda: [h.remove() for h in handles])


class NullRecorder(Recorder):
    """A recorder that drops every capture: what is left is the runner's hook machinery."""

    def record(self, tensor, **ids) -> None:
        return None


def runner_noop(model, x) -> Variant:
    session = HookSession(model, build_hooks(preset("stats")), NullRecorder()).__enter__()

    def step():
        _train_step(model, x)
        session.after_backward()
        session.recorder.drain()

    return Variant("runner no-op machinery", "the `stats` preset's callbacks with a recorder that drops every capture",
                   model, step, session.close)


def stats_by_hand(model, x) -> Variant:
    """The best hand-written statistics: sum, dot, aminmax on the device, one host sync per step."""
    raw: list[torch.Tensor] = []

    def reduce(t: torch.Tensor) -> None:
        flat = t.detach().reshape(-1)
        lo, hi = torch.aminmax(flat)
        raw.append(torch.stack([flat.sum(), torch.dot(flat, flat), lo, hi]))

    def on_forward(_module, _args, out):
        reduce(out)
        if out.requires_grad:
            out.register_hook(reduce)

    handles = [m.register_forward_hook(on_forward) for m in leaves(model)]

    def step():
        _train_step(model, x)
        torch.stack(raw).tolist()  # one host transfer for the step
        raw.clear()

    return Variant("stats by hand", "sum + dot + aminmax of every leaf output and output gradient, one host sync",
                   model, step, lambda: [h.remove() for h in handles])


def clip_by_hand(model, x) -> Variant:
    """The tutorials' ``gradient_clipper``: a tensor hook on every parameter clamping its gradient to the
    ``clip`` preset's bounds, recording nothing."""
    bounds = preset("clip")["clip"]
    handles = [p.register_hook(lambda grad: grad.clamp(bounds["min"], bounds["max"])) for p in model.parameters()]
    return Variant("clip by hand", "`grad.clamp(min, max)` in a tensor hook on every parameter, nothing recorded",
                   model, lambda: _train_step(model, x), lambda: [h.remove() for h in handles])


def runner_hooks(name: str, what: str, model, x, entries: dict) -> Variant:
    """Hooks built from ``entries`` through the real ``HookSession``; ``drain`` every step."""
    session = HookSession(model, build_hooks(entries)).__enter__()

    def step() -> StepCaptures:
        _train_step(model, x)
        session.after_backward()
        return session.recorder.drain()

    return Variant(name, what, model, step, session.close)


def extract_by_hand(model, x, layers: list[str]) -> Variant:
    kept: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())

    def hook_for(name):
        def on_forward(_module, _args, out):
            kept[name] = out.detach().clone()
        return on_forward

    handles = [modules[n].register_forward_hook(hook_for(n)) for n in layers]
    return Variant("extract by hand", f"forward hooks copying {' + '.join(layers)}",
                   model, lambda: _train_step(model, x), lambda: [h.remove() for h in handles])


def runner_extract_parquet(model, x, layers: list[str]) -> Variant:
    """The `extract` preset written to ``tensors.parquet`` through ``RunOutputs`` every step."""
    stack = ExitStack()
    out_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-extract-")))
    inner = runner_hooks("", "", model, x, extract_preset(layers))
    stack.callback(inner.close)
    outputs = stack.enter_context(RunOutputs(out_dir / "run", "benchmark: extract"))
    step_no = iter(range(1 << 62))

    def step():
        captures = inner.step()
        outputs.write_step(next(step_no), captures, loss=None, wall_time_s=0.0)

    return Variant("runner extract (parquet)", "the `extract` preset written to tensors.parquet every step",
                   model, step, stack.close)


def feature_extractor(model, x, layers: list[str]) -> Variant:
    """torchvision's ``create_feature_extractor`` returning the layers and the logits."""
    from torchvision.models.feature_extraction import create_feature_extractor

    head = [name for name, _ in model.named_children()][-1]
    fx = create_feature_extractor(model, return_nodes=[*layers, head])
    kept: dict[str, torch.Tensor] = {}

    def step():
        fx.zero_grad(set_to_none=True)
        out = fx(x)
        kept.update({n: out[n].detach() for n in layers})
        out[head].sum().backward()

    return Variant("create_feature_extractor", "torchvision FX graph returning the layers and the logits", fx, step)


def wandb_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("wandb") is not None


def wandb_watch(model, x, log: str) -> Variant:
    """W&B's ``wandb.watch(model, log=LOG, log_freq=1)`` in an offline run, one ``wandb.log`` a step."""
    import wandb

    stack = ExitStack()
    run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-wandb-"))
    run = wandb.init(mode="offline", dir=run_dir, project="hook-runner-benchmark")  # wandb.watch logs to wandb.run
    stack.callback(run.finish)
    run.watch(model, log=log, log_freq=1)

    def step():
        loss = _train_step(model, x)
        run.log({"loss": loss.item()})

    return Variant(f"wandb.watch(log={log!r})", f"W&B's watch, log={log!r}, log_freq=1, offline run",
                   model, step, stack.close)
