"""The measures interventions are judged by (``metric:``), taken from the model's output each step.

A forward hook on the model itself, registered after the run's entries, reads the final output
of every pass (after every edit) without changing it. Measures are registered by name
(``@METRICS.register``, one ``steps.parquet`` column each): ``logit`` is the batch mean of the logit
of class ``metric.target``, ``logit_diff`` the batch mean of ``logit[diff[0]] - logit[diff[1]]``;
a measure of your own is one module (``metric._module_``) registering a builder like theirs.
For a token model (logits ``[batch, positions, vocab]``) each reads the last position.
``take()`` gives the mean over the passes since the last ``take`` (one per training step; the
batches of an eval) and starts afresh.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch import nn

from common.errors import ConfigError
from common.records import STEP_COLUMNS, STEP_METRICS
from runner.config.registry import METRICS
from runner.config.schema import MetricConfig
from runner.sources.losses import first_tensor


def check_metric(metric: MetricConfig, classes: int | None) -> None:
    """``metric.target`` and ``metric.diff`` name classes of the model (when it says how many), and
    ``metric.measures`` registered measures whose names are not the steps table's own columns."""
    if metric.diff is not None and len(metric.diff) != 2:
        raise ConfigError(f"metric.diff: {list(metric.diff)} must be two classes (or token ids) [a, b]: "
                          f"logit_diff = logit[a] - logit[b]")
    for key, values in (("metric.target", [metric.target]), ("metric.diff", metric.diff or [])):
        for value in values:
            if value is not None and (value < 0 or (classes is not None and value >= int(classes))):
                raise ConfigError(f"{key}: {value} is not a class of a model with num_classes={classes}; "
                                  f"use integers in [0, {int(classes or 1) - 1}]")
    for name in chosen_measures(metric):
        if name in STEP_COLUMNS:
            raise ConfigError(f"metric.measures: '{name}' is a column steps.parquet already has "
                              f"({', '.join(STEP_COLUMNS)}); register the measure under another name")


#: A registered measure's builder: the metric config in, the measure of one pass's ``[batch, classes]``
#: logits out as a scalar tensor in their graph (what ``attribution`` differentiates), or ``None``
#: when the config does not ask for it (``logit`` without ``metric.target``).
Measure = Callable[[torch.Tensor], torch.Tensor]

#: What each built-in measure needs from ``metric``, for the one line that says it is missing.
NEEDS = {"logit": "metric.target=C (the class or token whose logit it is)",
         "logit_diff": "'metric.diff=[A,B]' (logit of A minus logit of B)"}


@METRICS.register("logit")
def logit(metric: MetricConfig) -> Measure | None:
    """The batch mean of the logit of class (or token) ``metric.target``."""
    if metric.target is None:
        return None
    return lambda logits: logits[:, metric.target].mean()


@METRICS.register("logit_diff")
def logit_diff(metric: MetricConfig) -> Measure | None:
    """The batch mean of ``logit[diff[0]] - logit[diff[1]]``."""
    if metric.diff is None:
        return None
    a, b = metric.diff
    return lambda logits: (logits[:, a] - logits[:, b]).mean()


def chosen_measures(metric: MetricConfig) -> dict[str, Measure]:
    """The measures a run takes: ``metric.measures`` (every registered one when null) whose
    options are set, by name; a name not registered is the one-line error listing the choices."""
    names = METRICS if metric.measures is None else metric.measures
    built = {name: METRICS.get(name).build(metric) for name in names}
    return {name: measure for name, measure in built.items() if measure is not None}


def step_measures(metric: MetricConfig) -> tuple[str, ...]:
    """``steps.parquet``'s measure columns for a run with ``metric``: the built-in ones, then its own
    measures and their ``clean_``/``corrupted_`` twins (``runner.engine.side_by_side``)."""
    own = [name for name in chosen_measures(metric) if name not in STEP_METRICS]
    return (*STEP_METRICS, *own, *(f"{side}_{name}" for side in ("clean", "corrupted") for name in own))


def last_position_logits(output: torch.Tensor) -> torch.Tensor:
    """``[batch, classes]`` logits; a token model's ``[batch, positions, vocab]`` read at its last position."""
    return output[:, -1] if output.dim() == 3 else output


def missing_metric(metric: MetricConfig, name: str) -> str | None:
    """What ``metric`` lacks to give measure ``name``, in one line; ``None`` if nothing."""
    if METRICS.get(name).build(metric) is not None:
        return None
    return f"{name} needs {NEEDS.get(name, f'the metric keys its builder reads (metric.target, metric.diff)')}"


def metric_value(output: torch.Tensor, metric: MetricConfig, name: str) -> torch.Tensor:
    """Measure ``name`` of one model output as a scalar tensor in its graph (what ``attribution``
    differentiates)."""
    measure = METRICS.get(name).build(metric)
    if measure is None:
        raise ConfigError(missing_metric(metric, name))
    return measure(last_position_logits(output))




class OutputMetrics:
    """``with OutputMetrics(model, metric) as m:`` ... ``m.take()`` after each step (or eval)."""

    def __init__(self, model: nn.Module, metric: MetricConfig) -> None:
        self.model, self.metric = model, metric
        self.measures = chosen_measures(metric)
        self.wanted = bool(self.measures)
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
        logits = last_position_logits(first_tensor(output).detach().double())  # measured in float64
        self.seen.append({name: float(measure(logits)) for name, measure in self.measures.items()})

    def take(self) -> dict[str, float]:
        """The mean of each measure over the passes since the last call."""
        seen, self.seen = self.seen, []
        return {name: statistics.fmean(s[name] for s in seen) for name in (seen[0] if seen else {})}
