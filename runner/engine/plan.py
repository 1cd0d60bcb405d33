"""``plan=true``: what a config would do, computed on the meta device without running it.

For each hook entry: the modules its selector matches (or the error, with the closest names),
the PyTorch hooks it registers, and how many tensors (and bytes) it would record per step. The
model is built on the meta device and the step (forward and, if the loss asks, backward) runs
there with the real hooks attached: shapes are exact and nothing is computed or allocated.
The module table lists every module's name, class and output shape, so nobody has to print
``named_modules()`` by hand.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from omegaconf import DictConfig
from torch.nn.modules import module as nn_module

from hooks.errors import ConfigError
from hooks.recorder import Recorder, walk
from runner.engine.rehearsal import explain_backward_hook_errors, meta_inputs, meta_step
from runner.engine.loop import check_run


class PlanRecorder(Recorder):
    """Counts what would be recorded, by (entry, kind); computes no statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])

    def record(self, tensor, *, hook, layer, phase, kind, slot, call, keep=False) -> None:
        entry = self.counts[(hook, kind)]
        entry[0] += 1
        entry[1] += tensor.numel() * tensor.element_size()
        entry[2] += tensor.numel() * 4 if keep else 0  # kept values are stored as float32


def plan(cfg: DictConfig) -> tuple[str, bool]:
    """Return the plan as text and whether every entry resolved."""
    settings = check_run(cfg)  # the same checks as a run, so a plan fails where the run would
    hooks, loss_fn = settings.hooks, settings.loss_fn
    model, x = meta_inputs(cfg)
    lines, ok = [], True
    shapes = _output_shapes(model, x)
    lines.append(f"model: {type(model).__name__}, {len(shapes)} modules "
                 f"({sum(p.numel() for p in model.parameters()):,} parameters); input {list(x.shape)}")
    for name, module in model.named_modules():
        lines.append(f"  {name or '(model)':<32} {type(module).__name__:<20} {shapes.get(name, '-')}")
    for hook in hooks:
        lines.append(f"{hook.key} (type {hook.spec.type}): {hook.pytorch_hooks}")
        try:
            names = [n or "(model)" for n, _ in hook.targets(model)]
        except ConfigError as exc:
            lines.append(f"  error: {exc}")
            ok = False
            continue
        lines.append(f"  {len(names)} module(s): {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}")
    if ok and hooks:
        lines += _captures(model, x, hooks, loss_fn)
    return "\n".join(lines), ok


def _output_shapes(model, x) -> dict[str, str]:
    names = {id(m): n for n, m in model.named_modules()}
    shapes: dict[str, str] = {}

    def on_forward(module, args, output):
        name = names.get(id(module))
        if name is not None and name not in shapes:
            shapes[name] = " ".join(str(list(t.shape)) for _, t in walk(output)) or "-"

    handle = nn_module.register_module_forward_hook(on_forward)
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return shapes


def _captures(model, x, hooks, loss_fn) -> list[str]:
    recorder = PlanRecorder()
    explain_backward_hook_errors(hooks, meta_step, model, x, hooks, loss_fn, recorder)
    lines = ["per step:"]
    for (hook, kind), (count, nbytes, kept) in sorted(recorder.counts.items()):
        lines.append(f"  hooks.{hook}: {count} {kind} tensor(s), {_size(nbytes)} seen"
                     + (f", {_size(kept)} kept in tensors.parquet" if kept else ""))
    return lines


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
