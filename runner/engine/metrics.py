"""The measures interventions are judged by (``metric:``), taken from the model's output each step.

A forward hook on the model itself, registered after the run's entries, reads the final output
of every pass (after every edit) without changing it: ``logit`` is the batch mean of the logit
of class ``metric.target``, ``logit_diff`` the batch mean of ``logit[diff[0]] - logit[diff[1]]``.
For a token model (logits ``[batch, positions, vocab]``) both are read at the last position.
``take()`` gives the mean over the passes since the last ``take`` (one per training step; the
batches of an eval) and starts afresh.
"""
from __future__ import annotations

import statistics

import torch
from torch import nn

from common.errors import ConfigError
from runner.config.schema import MetricConfig
from runner.sources.losses import first_tensor


def check_metric(metric: MetricConfig, classes: int | None) -> None:
    """``metric.target`` and ``metric.diff`` name classes of the model (when it says how many)."""
    if metric.diff is not None and len(metric.diff) != 2:
        raise ConfigError(f"metric.diff: {list(metric.diff)} must be two classes (or token ids) [a, b]: "
                          f"logit_diff = logit[a] - logit[b]")
    for key, values in (("metric.target", [metric.target]), ("metric.diff", metric.diff or [])):
        for value in values:
            if value is not None and (value < 0 or (classes is not None and value >= int(classes))):
                raise ConfigError(f"{key}: {value} is not a class of a model with num_classes={classes}; "
                                  f"use integers in [0, {int(classes or 1) - 1}]")


def metric_value(output: torch.Tensor, metric: MetricConfig, name: str) -> torch.Tensor:
    """``logit`` or ``logit_diff`` of one output as a scalar tensor in its graph (what
    ``attribution`` differentiates), as the module docstring defines them."""
    logits = output[:, -1] if output.dim() == 3 else output  # [batch, positions, vocab]: the last position
    if name == "logit" and metric.target is not None:
        return logits[:, metric.target].mean()
    if name == "logit_diff" and metric.diff is not None:
        a, b = metric.diff
        return (logits[:, a] - logits[:, b]).mean()
    raise ConfigError(missing_metric(metric, name) or f"{name} is not a metric: choose logit or logit_diff")


def missing_metric(metric: MetricConfig, name: str) -> str | None:
    """What ``metric`` lacks to give ``name`` (``logit``, ``logit_diff``), in one line; ``None`` if nothing."""
    if name == "logit" and metric.target is None:
        return "logit needs metric.target=C (the class or token whose logit it is)"
    if name == "logit_diff" and metric.diff is None:
        return "logit_diff needs 'metric.diff=[A,B]' (logit of A minus logit of B)"
    return None


def logit_metrics(output: torch.Tensor, metric: MetricConfig) -> dict[str, float]:
    """``logit`` and ``logit_diff`` of one output, as the module docstring defines them (in float64)."""
    logits = output.detach().double()
    names = ["logit"] * (metric.target is not None) + ["logit_diff"] * (metric.diff is not None)
    return {name: float(metric_value(logits, metric, name)) for name in names}


class OutputMetrics:
    """``with OutputMetrics(model, metric) as m:`` ... ``m.take()`` after each step (or eval)."""

    def __init__(self, model: nn.Module, metric: MetricConfig) -> None:
        self.model, self.metric = model, metric
        self.wanted = metric.target is not None or metric.diff is not None
        self.seen: list[dict[str, float]] = []
        self._handle = None

    def __enter__(self) -> OutputMetrics:
        if self.wanted:
            self._handle = self.model.register_forward_hook(self._on_output)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._handle is not None:
            self._handle.remove()

    def _on_output(self, module: nn.Module, args: tuple, output: object) -> None:
        self.seen.append(logit_metrics(first_tensor(output), self.metric))

    def take(self) -> dict[str, float]:
        """The mean of each measure over the passes since the last call."""
        seen, self.seen = self.seen, []
        return {name: statistics.fmean(s[name] for s in seen) for name in (seen[0] if seen else {})}
