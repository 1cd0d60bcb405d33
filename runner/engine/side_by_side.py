"""The clean and corrupted passes beside each step, for entries that ask for them (``HookType.side_data``).

``patch`` with ``source: clean`` runs the classic pair side by side: before the step proper (the
corrupted batch, patched), the clean batch goes through the model while those entries keep their
layers' outputs (``side_mode("capture")``), then the corrupted batch goes through unpatched
(``side_mode("off")``). Both passes run without
gradients and outside the run's records (``Recorder.aside``: no rows, no call counted), with
the run's other entries acting as they do in every pass, and leave the model's buffers (BatchNorm
running statistics) and the random number generators as they found them: each pass draws the
dropout masks the step proper then draws, so in train mode a patched layer's clean value meets the
same masks downstream in both passes, and the run's later randomness is that of a run without them.
The clean pass runs only when an entry needs it (``HookType.side_clean``: ``steer`` compares the
step with its own batch unsteered, the second pass alone). Their metrics (``metric.target``,
``metric.diff``) become ``clean_*`` and ``corrupted_*`` columns of the step's ``steps.parquet`` row,
so one job holds the clean, corrupted and patched values of its recovered fraction. An entry that
asks for a metric's gradient (``HookType.side_metric``: ``attribution``) gets it in the corrupted
pass, which then runs with gradients, and takes what it needs there (``side_backward``): one clean
pass, one corrupted pass and one backward.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from hooks.mechanism.base import HookType
from hooks.mechanism.recorder import Recorder
from runner.engine.metrics import OutputMetrics, metric_value
from runner.engine.train import Forward
from runner.sources.losses import first_tensor


def clean_and_corrupted(forward: Forward, model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor,
                        entries: list[HookType], recorder: Recorder, measures: OutputMetrics) -> dict[str, float]:
    """Run the clean pass (``entries`` keep their values; when one needs it) and the unpatched corrupted
    pass; return their metrics, prefixed ``clean_`` and ``corrupted_``. Entries with a ``side_metric`` get
    that metric of the corrupted pass, which then runs with gradients (``side_backward``)."""
    buffers = [(b, b.clone()) for b in model.buffers()]
    differentiating = [entry for entry in entries if entry.side_metric is not None]
    metrics: dict[str, float] = {}
    try:
        passes = [("clean", clean, "capture")] if any(entry.side_clean for entry in entries) else []
        for side, batch, mode in (*passes, ("corrupted", corrupted, "off")):
            gradients = side == "corrupted" and bool(differentiating)
            with contextlib.ExitStack() as stack:
                stack.enter_context(recorder.aside())  # each pass counts its calls as the step proper does
                stack.enter_context(_same_randomness(batch.device))
                stack.enter_context(torch.set_grad_enabled(gradients))
                for entry in entries:
                    stack.enter_context(entry.side_mode(mode))
                output = forward(batch)
                for entry in differentiating if gradients else ():
                    entry.side_backward(metric_value(first_tensor(output), measures.metric, entry.side_metric))
            metrics.update({f"{side}_{name}": value for name, value in measures.take().items()})
    finally:
        with torch.no_grad():
            for buffer, kept in buffers:
                buffer.copy_(kept)
    return metrics


def _same_randomness(device: torch.device):
    """Fork the CPU generator (and ``device``'s, on an accelerator): the pass inside starts from the
    state the step proper will start from, and leaves it so."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)
