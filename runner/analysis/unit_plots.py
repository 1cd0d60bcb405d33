"""Pictures of ``units.parquet``: a unit's top examples, and per-layer distributions of unit means and dead fractions.

* ``top_images(units, layer, unit, images, maps)``: the unit's top-k images in a grid, each with
  the unit's map (its channel of the layer's output for that image, ``unit_maps``) overlaid and
  the value and sample id in the title; the maximum's position is marked. ``top_images_of_run``
  draws it from a run directory alone: the model rebuilt from its config and seed (``rebuild_run``),
  the images read from its data by sample id.
* ``top_tokens(units, layer, unit, tokens, decode)``: the unit's top-k sequences as text, the token
  at the maximum's position bracketed, with a few tokens of context either side; ``top_tokens_of_run``
  reads the sequences from a run's data by sample id (the ids shown as numbers: no tokenizer is kept).
* ``layer_histograms(units)``: per layer, a histogram of its units' means and one of their dead
  fractions (the share of values at or below the entry's threshold).

Each returns a matplotlib ``Figure`` (``runner.analysis.plots.save_png(fig, path)``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from torch import nn

from hooks.recorder import walk
from hooks.unit_stats import default_unit_axis
from runner.engine.plan import Plan, compile_plan
from runner.sources.models import build_model


def unit_row(units: pd.DataFrame, layer: str, unit: int, call: int = 0) -> pd.Series:
    """The row of ``unit`` of ``layer`` (its ``call``-th call in a step) in a ``load_units`` frame."""
    rows = units[(units.layer == layer) & (units.unit == unit) & (units.call == call)]
    if rows.empty:
        raise KeyError(f"no unit {unit} of layer '{layer}' (call {call}); layers: {sorted(set(units.layer))}")
    return rows.iloc[0]


def unit_maps(model: nn.Module, layer: str, unit: int, inputs: torch.Tensor, axis: int | None = None,
              slot: str = "0") -> np.ndarray:
    """Unit ``unit`` of ``layer``'s output for each of ``inputs`` by a plain forward: ``[n, H, W]`` for a
    conv output (its channel), ``[n]`` where the unit has no map. ``axis``, ``slot``: the entry's
    ``unit_axis`` (``None``: dim 1 of 4+ dim outputs, else the last) and ``slot`` (which tensor of a
    tuple or mapping output, as the entry read it: ``hooks.recorder.walk``)."""
    kept = []

    def keep(module, args, output):
        out = dict(walk(output))[slot]
        kept.append(out.detach().float().movedim(default_unit_axis(out.dim()) if axis is None else axis, 1)[:, unit])

    handle = dict(model.named_modules())[layer].register_forward_hook(keep)
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        handle.remove()
    return kept[0].numpy()


@dataclass
class RebuiltRun:
    """A whole-dataset run rebuilt from its ``config.yaml``: its plan, whose data source reads inputs
    back by sample id, and its model built after the run's seed (random weights are the run's)."""

    plan: Plan
    model: nn.Module

    def inputs(self, samples: Sequence[int]) -> torch.Tensor:
        """The model inputs of ``samples`` (dataset indices, shards' ids included), in that order."""
        seed, cpu = self.plan.settings.seed, torch.device("cpu")
        return torch.cat([next(self.plan.data.item_batches(int(s), int(s) + 1, seed, cpu)).x for s in samples])

    def spec(self, hook: str):
        """The spec of the run's entry ``hook`` (its ``unit_axis`` and ``slot``)."""
        return next(h.spec for h in self.plan.hooks if h.key == f"hooks.{hook}")

    def images(self, inputs: torch.Tensor) -> np.ndarray:
        """``inputs`` (``[n, C, H, W]``, normalised by ``data.mean``/``data.std`` where given) as RGB in [0, 1]."""
        channels = inputs.shape[1]
        mean = torch.tensor(list(self.plan.data.data.get("mean") or [0.0] * channels)).view(1, -1, 1, 1)
        std = torch.tensor(list(self.plan.data.data.get("std") or [1.0] * channels)).view(1, -1, 1, 1)
        images = (inputs * std + mean).clamp(0, 1)
        return (images.expand(-1, 3, -1, -1) if channels == 1 else images).permute(0, 2, 3, 1).numpy()


def rebuild_run(run_dir: str | Path) -> RebuiltRun:
    """The run at ``run_dir`` rebuilt on the CPU from its ``config.yaml`` (``FileNotFoundError`` without
    one), wherever it ran: a GPU run's units are drawn on a machine without one."""
    plan = compile_plan(OmegaConf.load(Path(run_dir) / "config.yaml"), check_device=False)
    torch.manual_seed(plan.settings.seed)
    return RebuiltRun(plan, build_model(plan.model).eval())


def top_images_of_run(run: str | Path | RebuiltRun, units: pd.DataFrame, layer: str, unit: int,
                      shown: int | None = None) -> Figure:
    """``top_images`` of a whole-dataset run of an image model (a run directory, or ``rebuild_run``'s
    result to draw several units of one run): its first ``shown`` top samples (default all) read
    from its data, the maps recomputed."""
    run = run if isinstance(run, RebuiltRun) else rebuild_run(run)
    row = unit_row(units, layer, unit)
    inputs = run.inputs(row.top_sample[:shown])
    spec = run.spec(row.hook)
    maps = unit_maps(run.model, layer, unit, inputs, spec.unit_axis, spec.slot)
    return top_images(units, layer, unit, run.images(inputs), maps if maps.ndim == 3 else None)


def top_tokens_of_run(run: str | Path | RebuiltRun, units: pd.DataFrame, layer: str, unit: int,
                      shown: int | None = None) -> Figure:
    """``top_tokens`` of a whole-dataset run of a token model: its first ``shown`` top sequences read
    from its data by sample id, each token shown as its id."""
    run = run if isinstance(run, RebuiltRun) else rebuild_run(run)
    samples = unit_row(units, layer, unit).top_sample[:shown]
    tokens = dict(zip((int(s) for s in samples), run.inputs(samples)))
    return top_tokens(units, layer, unit, tokens, lambda ids: [str(i) for i in ids], shown=shown)


def top_images(units: pd.DataFrame, layer: str, unit: int, images: np.ndarray, maps: np.ndarray | None,
               ncols: int = 4) -> Figure:
    """The unit's top images (``images``: ``[k, H, W, 3]`` in [0, 1], in ``top_sample`` order) with its
    ``maps`` (``[k, h, w]``) upsampled and overlaid, the maximum's position marked with a cross
    (``maps=None``: a unit without a map, such as a feature of a linear output; the images alone)."""
    row = unit_row(units, layer, unit)
    k = len(images)
    nrows = math.ceil(k / ncols)
    fig = Figure(figsize=(2.4 * ncols, 2.6 * nrows + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).reshape(-1)
    top = (float(np.max(maps)) or 1.0) if maps is not None else None
    for i, ax in enumerate(axes):
        ax.set_axis_off()
        if i >= k:
            continue
        ax.imshow(images[i])
        ax.set_title(f"sample {int(row.top_sample[i])}: {row.top_value[i]:.3g}", fontsize=9)
        if maps is not None:
            shown = _overlay(ax, images[i], maps[i], int(row.top_position[i]), top)
    if maps is not None:
        fig.colorbar(shown, ax=axes.tolist(), shrink=0.6, label=f"{layer} unit {unit}")
    fig.suptitle(f"Top {k} samples of {layer} unit {unit} (mean {row['mean']:.3g}, max {row['max']:.3g})")
    return fig


def _overlay(ax, image: np.ndarray, unit_map: np.ndarray, position: int, top: float):
    """``unit_map`` upsampled over ``image`` on ``ax``, a cross where the maximum was (``position``, flat)."""
    height, width = image.shape[:2]
    shown = ax.imshow(unit_map, cmap="magma", alpha=0.55, vmin=0, vmax=top, extent=(0, width, height, 0),
                      interpolation="bilinear")
    h, w = unit_map.shape
    y, x = divmod(position, w)
    ax.plot((x + 0.5) * width / w, (y + 0.5) * height / h, "c+", markersize=12, markeredgewidth=2)
    return shown


def top_tokens(units: pd.DataFrame, layer: str, unit: int, tokens: torch.Tensor | Mapping[int, torch.Tensor],
               decode: Callable[[Sequence[int]], list[str]], context: int = 6, shown: int | None = None) -> Figure:
    """The unit's first ``shown`` top sequences (default all) as text: ``tokens`` is the dataset
    (``[samples, positions]``, or its top samples by id), ``decode`` turns ids into strings; the
    maximum's token is bracketed, ``context`` tokens shown either side."""
    row = unit_row(units, layer, unit)
    lines = []
    for sample, position, value in zip(row.top_sample[:shown], row.top_position, row.top_value):
        ids = tokens[int(sample)].tolist()
        first, last = max(0, position - context), min(len(ids), position + context + 1)
        words = decode(ids[first:last])
        words[position - first] = f"[{words[position - first]}]"
        lines.append(f"{value:8.3f}  #{int(sample):<5d} pos {int(position):<3d} {' '.join(words)}")
    fig = Figure(figsize=(11, 0.32 * len(lines) + 0.8), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.text(0, 1, "\n".join(lines), family="monospace", fontsize=9, va="top", transform=ax.transAxes)
    ax.set_title(f"Top {len(lines)} tokens of {layer} unit {unit} (value, sample, position, context)", loc="left")
    return fig


def layer_histograms(units: pd.DataFrame, bins: int = 40) -> Figure:
    """Per layer (a row of two panels): its units' means, and their dead fractions (1 - ``fraction_above``)."""
    layers = list(dict.fromkeys(units.layer))
    fig = Figure(figsize=(9, 1.9 * len(layers) + 0.6), layout="constrained")
    axes = np.array(fig.subplots(len(layers), 2, squeeze=False))
    for (mean_ax, dead_ax), layer in zip(axes, layers):
        rows = units[units.layer == layer]
        dead = 1 - rows.fraction_above
        mean_ax.hist(rows["mean"], bins=bins, color="tab:blue")
        dead_ax.hist(dead, bins=np.linspace(0, 1, bins + 1), color="tab:red")
        mean_ax.set_ylabel(f"{layer}\n({len(rows)} units)", fontsize=9)
        dead_ax.set_title(f"{(dead >= 1).sum()} never above {rows.threshold.iloc[0]:g}", fontsize=8, loc="right")
    axes[-1, 0].set_xlabel("unit mean over the dataset")
    axes[-1, 1].set_xlabel("dead fraction (values <= threshold)")
    fig.suptitle("Units per layer: means and dead fractions")
    return fig
