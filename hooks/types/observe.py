"""Observer hook types: they record (and print) what flows through a module, never change it.

* ``stats``: statistics of the kinds listed in ``kinds`` (``input``, ``output``, ``grad_input``,
  ``grad_output``), per call.
* ``capture``: the same, keeping a copy of every tensor for ``tensors.parquet`` (the tutorial's
  feature extractor).
* ``print``: prints ``NAME: torch.Size([...])`` per call, in call order (other kinds as
  ``NAME grad_output[0]: torch.Size([...])``; ``values: true`` prints the tensor too), and
  records statistics of what it printed; with ``always_call: true`` it also reports a call
  whose forward raised.

Where each kind is taken, and why gradients use tensor hooks, is explained in ``hooks.mechanism.tap``.
"""
from __future__ import annotations

import torch

from hooks.mechanism.registry import register
from hooks.mechanism.tap import Tap
from hooks.specs.observe import CaptureSpec, ObserveSpec, PrintSpec


class Observe(Tap):
    """Records the tensors of ``spec.kinds``; returns nothing, so it cannot change a result."""

    spec_class = ObserveSpec

    @property
    def record_kinds(self) -> set[str]:
        return set(self.spec.kinds)


@register("stats")
class Stats(Observe):
    """Statistics only: the cheap way to watch every layer."""


@register("capture")
class Capture(Observe):
    """Statistics plus a copy of each tensor, written to ``tensors.parquet``."""

    spec_class = CaptureSpec
    keep = True


@register("print")
class Print(Observe):
    """Prints each tensor's shape as the tutorials' ``VerboseExecution`` does (values on request)."""

    spec_class = PrintSpec

    def on_record(self, layer: str, kind: str, slot: str, tensor: torch.Tensor) -> None:
        label = layer or "(model)"
        if kind != "output":
            label += f" {kind}[{slot}]"
        elif slot != "0":
            label += f"[{slot}]"
        text = f"{label}: {tensor.shape}"
        if self.spec.values:
            text += f" {tensor.detach()}"
        print(text, flush=True)

    def on_forward(self, layer: str, call: int, args: tuple, output) -> None:
        if output is None and self.spec.always_call:  # PyTorch passes None when forward raised
            print(f"{layer or '(model)'}: no output (forward raised)", flush=True)
