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
Their metrics (``metric.target``/``metric.diff``) become ``clean_*`` and ``corrupted_*`` columns of
the step's ``steps.parquet`` row, so one job holds the clean, corrupted and patched values of its
recovered fraction.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from hooks.base import HookType
from hooks.recorder import Recorder
from runner.engine.metrics import OutputMetrics
from runner.engine.train import Forward


def clean_and_corrupted(forward: Forward, model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor,
                        entries: list[HookType], recorder: Recorder, measures: OutputMetrics) -> dict[str, float]:
    """Run the clean pass (``entries`` keep their values) and the unpatched corrupted pass; return
    their metrics, prefixed ``clean_`` and ``corrupted_``."""
    buffers = [(b, b.clone()) for b in model.buffers()]
    metrics: dict[str, float] = {}
    try:
        with torch.no_grad(), recorder.aside():
            for side, batch, mode in (("clean", clean, "capture"), ("corrupted", corrupted, "off")):
                with contextlib.ExitStack() as stack:
                    stack.enter_context(_same_randomness(batch.device))
                    for entry in entries:
                        stack.enter_context(entry.side_mode(mode))
                    forward(batch)
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
