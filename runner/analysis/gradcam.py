"""Grad-CAM from what a run captured: a layer's output and the gradient of one class score.

Grad-CAM (Selvaraju et al., 2017) weighs each channel of a conv layer's output ``A`` by the mean
of its gradient ``dy_c/dA`` over the spatial positions, sums the weighted channels, keeps the
positive part and upsamples it to the input size. The runner collects both tensors with one
``capture`` entry (``kinds: [output, grad_output]``: a forward hook, and a tensor hook on the
output for the gradient; preset ``hooks=gradcam``) while ``loss=class_score`` backpropagates
the chosen class score.

Example:
    python -m runner model=resnet18 data=image data.path=assets/shapes.png \\
        loss=class_score hooks=gradcam plots=[grad_cam]
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runner.analysis.load import load_tensors


def grad_cam(activation: np.ndarray, gradient: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Class activation maps ``[N, H, W]`` in ``[0, 1]`` from an output and its gradient ``[N, C, h, w]``.

    Each map is scaled by its own minimum and maximum; a map that is constant (no positive
    evidence anywhere) is all 0. The channel weights are taken in float64, and a weight within the
    float32 gradient's own rounding of zero (a layer before a training-mode BatchNorm, whose output
    gradient sums to zero per channel) counts as 0: scaled to [0, 1], that noise would draw a map.
    """
    a, g = torch.as_tensor(activation, dtype=torch.float64), torch.as_tensor(gradient, dtype=torch.float64)
    if a.dim() != 4 or a.shape != g.shape:
        raise ValueError(f"grad_cam needs an output and a gradient of the same [N, C, h, w] shape, "
                         f"got {list(a.shape)} and {list(g.shape)}")
    weights = g.mean(dim=(2, 3), keepdim=True)
    rounding = torch.finfo(torch.float32).eps * g.abs().mean(dim=(2, 3), keepdim=True)
    weights = torch.where(weights.abs() > rounding, weights, torch.zeros_like(weights))
    cam = F.relu((weights * a).sum(dim=1, keepdim=True))
    cam = F.interpolate(cam, size=tuple(size), mode="bilinear", align_corners=False)[:, 0]
    lo = cam.amin(dim=(1, 2), keepdim=True)
    span = cam.amax(dim=(1, 2), keepdim=True) - lo
    return torch.where(span > 0, (cam - lo) / span.clamp_min(1e-12), torch.zeros_like(cam)).float().numpy()


def cam_layers(tensors) -> list[tuple[str, str]]:
    """``(hook, layer)`` pairs whose kept tensors allow Grad-CAM: a 4-D output and its gradient."""
    if tensors.empty:
        return []
    four_d = tensors[tensors["tensor"].map(np.ndim) == 4]
    kinds = four_d.groupby(["hook", "layer"], sort=False, observed=True)["kind"].agg(set)
    return [key for key, got in kinds.items() if {"output", "grad_output"} <= got]


def model_input_images(tensors, cfg, step: int = 0) -> np.ndarray:
    """The model input the run stored at ``step`` as ``[N, H, W, 3]`` in [0, 1], for overlays.

    The runner stores the input as rows of kind ``model_input`` when Grad-CAM is asked for.
    Inputs normalised with ``data.mean``/``data.std`` of the run's config ``cfg`` are
    un-normalised; other inputs are scaled by their own minimum and maximum.

    Raises:
        ValueError: the run stored no model input at ``step``, or it is not an RGB image batch.
    """
    rows = tensors[(tensors["kind"] == "model_input") & (tensors["step"] == step)] if not tensors.empty else tensors
    if rows.empty:
        raise ValueError(f"the run stored no model input at step {step} (kind 'model_input' in tensors.parquet), "
                         "so there is no image to overlay")
    x = torch.as_tensor(np.asarray(rows["tensor"].iloc[0], dtype=np.float32))
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"the model input has shape {list(x.shape)}, not [N, 3, H, W]: no image to overlay")
    data = (cfg or {}).get("data") or {}
    if data.get("mean") is not None and data.get("std") is not None:
        x = x * torch.tensor(list(data["std"])).view(1, 3, 1, 1) + torch.tensor(list(data["mean"])).view(1, 3, 1, 1)
    else:
        x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    return x.clamp(0, 1).permute(0, 2, 3, 1).numpy()


def explained_class(cfg, chosen: int | None = None) -> str:
    """Which class score the run backpropagated, as a title: ``class 7 (goldfish)`` or the top class.

    ``chosen``: the class ``loss=class_score`` took for the sample shown when no ``target_class``
    was given (the manifest's ``explained_classes``); without it the title says "top-scoring".

    The class name is given where the model's pretrained weights name their classes
    (torchvision's ``weights.meta["categories"]``; nothing is downloaded to read them).
    """
    if cfg is None:
        return "the class its loss chose (the run saved no config)"
    loss = cfg.get("loss") or {}
    if loss.get("name") != "class_score":
        return f"loss '{loss.get('name', 'unknown')}'"
    index = loss.get("target_class")
    if index is None and chosen is not None:
        index = chosen
    elif index is None:
        return "each sample's top-scoring class"
    names = _class_names(cfg.get("model") or {})
    return f"class {index}" + (f" ({names[index]})" if names and index < len(names) else "")


def _class_names(model) -> list[str] | None:
    if not model.get("weights") or not model.get("name"):
        return None
    try:
        import torchvision

        enum = torchvision.models.get_model_weights(model["name"])
        return list(enum[str(model["weights"])].meta["categories"])
    except (KeyError, ValueError, ImportError):  # not a torchvision model, or an unknown weights name
        return None


def grad_cam_of_run(run_dir: str | Path, layer: str, size: tuple[int, int], step: int = 0,
                    tensors=None) -> np.ndarray:
    """Grad-CAM maps ``[N, H, W]`` for ``layer`` at ``step`` (first call) of one run.

    ``tensors`` may be a frame already loaded with ``load_tensors`` (it is read otherwise).
    """
    if tensors is None:
        tensors = load_tensors(run_dir, filters=[("layer", "=", layer), ("step", "=", step), ("call", "=", 0)])
    rows = tensors[(tensors["layer"] == layer) & (tensors["step"] == step) & (tensors["call"] == 0)]
    found = {kind: rows[rows["kind"] == kind]["tensor"] for kind in ("output", "grad_output")}
    missing = [kind for kind, col in found.items() if col.empty]
    if missing:
        raise ValueError(f"grad_cam: no kept {' or '.join(missing)} of layer '{layer}' at step {step} in "
                         f"{run_dir}; capture it with hooks=gradcam hooks.gradcam.layers={layer}")
    return grad_cam(found["output"].iloc[0], found["grad_output"].iloc[0], size)
