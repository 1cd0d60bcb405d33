"""The width of the tensor an ``sae`` entry splices (its units: ``hooks.types.units``'s axis), read from the
model built on the meta device before the run, for models whose whole forward the meta device cannot run
(gpt2_tiny's mask code reads a value): the selected module alone is called there.

A module's input width is that of the first module in it that says what it reads (``Linear``'s
``in_features``, a norm's ``normalized_shape``, ``transformers``' ``Conv1D`` weight ``[in, out]``); its
output width is that of its output on a ``[1, 1, width]`` meta input. ``None`` where neither can be
known this way (another first module, a forward that needs more arguments or fails on meta): the
splice then checks the width at the first call.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from common.unit_sketch import default_unit_axis
from hooks.mechanism.recorder import walk


def input_width(module: nn.Module) -> int | None:
    """What the first module (in ``named_modules`` order) that names its input width reads, else ``None``."""
    for _, part in module.named_modules():
        if isinstance(part, nn.Linear):
            return part.in_features
        if isinstance(part, (nn.LayerNorm, nn.RMSNorm)) and part.normalized_shape:
            return part.normalized_shape[-1]
        weight = getattr(part, "weight", None)
        if type(part).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            return weight.shape[0]
    return None


def output_width(module: nn.Module, slot: Any) -> int | None:
    """The units of ``module``'s output tensor ``slot`` (or its only one) on a meta input, else ``None``."""
    width = input_width(module)
    if width is None or any(not t.is_meta for t in module.parameters()):
        return None
    try:
        with torch.no_grad():
            out = module(torch.empty(1, 1, width, device="meta"))
    except Exception:  # noqa: BLE001 - not callable alone on meta: the splice checks at the first call
        return None
    tensors = dict(walk(out))
    tensor = tensors.get(str(slot)) if slot is not None else next(iter(tensors.values())) if len(tensors) == 1 else None
    return tensor.shape[default_unit_axis(tensor.dim())] if isinstance(tensor, torch.Tensor) and tensor.dim() > 1 else None
