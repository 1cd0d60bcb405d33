"""How a capture is named outside the parquet files: plots, the TensorBoard export, live loggers.

One naming, so that a tag seen live in a dashboard (``runner.live``) is the tag the post-hoc
export (``runner.analysis.tensorboard``) writes for the same row: ``SPLIT/HOOK/LABEL/KIND`` for a
kept tensor's histogram, ``SPLIT/HOOK/LABEL/KIND/STAT`` for a statistic, ``SPLIT/METRIC`` for a
step's loss or measure. ``SPLIT`` is ``eval`` for the eval passes of a training run, else ``train``:
it leads, so that dashboards which group tags by their first part (TensorBoard, W&B) show the
training and eval values apart, each as ``HOOK/LAYER/KIND/STAT``.
Imports nothing of ``hooks`` or ``runner``.
"""
from __future__ import annotations


def label_of(layer: str, kind: str, slot: str, call: int) -> str:
    """A capture's name in plots and exports: ``conv``, ``fc.bias``, ``split[1]``, ``relu #1``."""
    name = layer or "(model)"
    if kind == "param_grad":
        name = f"{name}.{slot}"
    elif slot != "0":
        name = f"{name}[{slot}]"
    return f"{name} #{call}" if call else name


def split_of(phase: str) -> str:
    """The split a capture's phase belongs to: the eval passes apart from training."""
    return "eval" if phase == "eval" else "train"


def capture_tag(phase: str, hook: str, layer: str, kind: str, slot: str, call: int) -> str:
    """``SPLIT/HOOK/LABEL/KIND``: a capture's tag (a statistic's tag appends ``/STAT``)."""
    return f"{split_of(phase)}/{hook}/{label_of(layer, kind, slot, call)}/{kind}"
