"""``LogLine``: what one step sends to a live logger, made from the captures the parquet rows were made of.

Made on the background writer's thread, after the step's parquet rows, from the same
``StepCaptures`` and values, so every logged value is the value ``load_stats``/``load_steps``
read back. Tags are ``common.tags``' (the TensorBoard export's). Rows of a forward recomputed by
activation checkpointing (phase ``recompute``) are the same call again and are not logged twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from common.tags import capture_tag

if TYPE_CHECKING:  # the tool's process (``process``) imports this module: no torch for it
    from hooks.mechanism.recorder import StepCaptures


@dataclass
class LogLine:
    """One step of one split: ``scalars`` and ``histograms`` (float32 values) by tag; ``measures``: the
    tags among ``scalars`` of the step's loss and measures (``SPLIT/NAME``)."""

    step: int
    scalars: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    measures: set[str] = field(default_factory=set)

    def without_measures(self) -> LogLine:
        """The line without the step's loss and measures: the captures' statistics and histograms only."""
        scalars = {tag: value for tag, value in self.scalars.items() if tag not in self.measures}
        return LogLine(self.step, scalars, self.histograms)


def step_scalars(step: int, split: str, loss: float | None, metrics: dict[str, float | None]) -> LogLine:
    """The step's ``SPLIT/loss`` and ``SPLIT/METRIC`` scalars (NaN and missing values are not logged)."""
    line = LogLine(step)
    for name, value in {"loss": loss, **metrics}.items():
        if value is not None and not math.isnan(value):
            line.scalars[f"{split}/{name}"] = float(value)
            line.measures.add(f"{split}/{name}")
    return line


def add_statistics(line: LogLine, captures: StepCaptures, entries: frozenset[str], stats: dict[str, list[str]]) -> None:
    """``SPLIT/HOOK/LABEL/KIND/STAT`` of each capture of ``entries`` whose kind ``stats`` names."""
    columns = captures.columns
    if not columns:
        return
    rows = zip(columns["hook"], columns["layer"], columns["phase"], columns["kind"], columns["slot"], columns["call"])
    for i, (hook, layer, phase, kind, slot, call) in enumerate(rows):
        wanted = stats.get(kind)
        if not wanted or hook not in entries or phase == "recompute":
            continue
        tag = capture_tag(phase, hook, layer, kind, slot, call)
        for stat in wanted:
            line.scalars[f"{tag}/{stat}"] = float(captures.stats[stat][i])


def add_histograms(line: LogLine, captures: StepCaptures) -> None:
    """``SPLIT/HOOK/LABEL/KIND``: the values of every kept tensor (those ``tensors.parquet`` holds)."""
    columns = captures.columns
    for row, tensor in zip(captures.kept_rows, captures.kept):
        if columns["phase"][row] == "recompute":
            continue
        tag = capture_tag(columns["phase"][row], columns["hook"][row], columns["layer"][row], columns["kind"][row],
                          columns["slot"][row], columns["call"][row])
        line.histograms[tag] = tensor.reshape(-1).float().numpy()
