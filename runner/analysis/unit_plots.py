"""Pictures of ``units.parquet``: a unit's top examples, and per-layer distributions of unit means and dead fractions.

* ``top_images(units, layer, unit, images, maps, names)``: the unit's top-k images in a grid, each
  titled by its name (an ``imagefolder`` file's path under the folder; its dataset index otherwise;
  ``unnamed`` where the data cannot say), class
  and value, with the unit's map over it as a heat that is transparent where the unit is quiet and an
  outline where it is above half its range; the maximum's position is marked, and a legend says so.
  ``top_images_of_run`` draws it from a run directory alone: the maps and inputs the run
  kept for its top examples (``unit_examples.parquet``, ``unit_inputs.parquet``: the run's own
  weights at the step it saw each sample). Nothing is computed again; a run that kept none is
  refused in one line.
* ``top_tokens(units, layer, unit, tokens, decode)``: the unit's top-k sequences as text, the token
  at the maximum's position bracketed, with a few tokens of context either side; ``top_tokens_of_run``
  reads the sequences the run kept (the ids shown as numbers: no tokenizer is kept).
* ``layer_histograms(units)``: per layer, a histogram of its units' means and one of their dead
  fractions (the share of values at or below the entry's threshold).

Each returns a matplotlib ``Figure`` (``runner.analysis.plots.save_png(fig, path)``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from common.run_config import saved_config_path
from runner.analysis.load import run_dirs
from runner.analysis.units import UNNAMED, classes_said, kept_inputs, load_unit_examples


def unit_row(units: pd.DataFrame, layer: str, unit: int, call: int = 0) -> pd.Series:
    """The row of ``unit`` of ``layer`` (its ``call``-th call in a step) in a ``load_units`` frame."""
    rows = units[(units.layer == layer) & (units.unit == unit) & (units.call == call)]
    if rows.empty:
        raise KeyError(f"no unit {unit} of layer '{layer}' (call {call}); layers: {sorted(set(units.layer))}")
    return rows.iloc[0]


@dataclass
class RunExamples:
    """What a run kept for pictures of its units' top examples, read from its files only."""

    examples: pd.DataFrame                      #: ``load_unit_examples``
    inputs: dict[tuple[str, int], np.ndarray]   #: ``load_unit_inputs``
    names: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)  #: ``load_unit_names``
    mean: list[float] | None = None             #: the run's ``data.mean`` / ``data.std`` (images are shown un-normalised)
    std: list[float] | None = None

    def of(self, row: pd.Series, shown: int | None) -> pd.DataFrame:
        """The kept examples of the unit ``row`` (a ``load_units`` row), first ``shown``; one line if none."""
        rows = self.examples[(self.examples.hook == row.hook) & (self.examples.layer == row.layer)
                             & (self.examples.call == row.call) & (self.examples.unit == row.unit)]
        if rows.empty:
            raise ValueError(f"the run kept no top examples of {row.layer} unit {row.unit} (its units entry had "
                             f"examples: 0); run it again with hooks.{row.hook}.examples=4")
        return rows.sort_values("rank").head(shown)

    def input_of(self, hook: str, sample: int) -> np.ndarray:
        if (hook, sample) not in self.inputs:
            raise ValueError(f"the run kept no input of sample {sample} (only images [C, H, W] and token ids are "
                             f"kept): its top examples cannot be shown")
        return self.inputs[(hook, sample)]

    def images(self, hook: str, samples: Sequence[int]) -> np.ndarray:
        """The kept inputs of ``samples`` as RGB ``[n, H, W, 3]`` in [0, 1] (un-normalised by ``data.mean``/``std``)."""
        inputs = np.stack([self.input_of(hook, int(s)) for s in samples])
        channels = inputs.shape[1]
        if inputs.ndim != 4 or channels not in (1, 3):
            raise ValueError(f"the kept inputs have shape {list(inputs.shape[1:])}, not an image of 1 or 3 channels")
        mean = np.asarray(self.mean or [0.0] * channels, np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.std or [1.0] * channels, np.float32).reshape(1, -1, 1, 1)
        images = np.clip(inputs * std + mean, 0, 1)
        return np.repeat(images, 3, axis=1).transpose(0, 2, 3, 1) if channels == 1 else images.transpose(0, 2, 3, 1)


def run_examples(run_dir: str | Path) -> RunExamples:
    """What the run at (or the sweep under) ``run_dir`` kept for its top examples (``FileNotFoundError``
    for a run that kept none), with its data's normalisation from its ``config.yaml``."""
    examples, (inputs, names) = load_unit_examples(run_dir), kept_inputs(run_dir)
    config = saved_config_path(run_dirs(run_dir)[0])  # a sweep's jobs read the same data
    data = (OmegaConf.to_container(OmegaConf.load(config)).get("data") or {}) if config else {}
    return RunExamples(examples, inputs, names, data.get("mean"), data.get("std"))


def top_images_of_run(run: str | Path | RunExamples, units: pd.DataFrame, layer: str, unit: int,
                      shown: int | None = None) -> Figure:
    """``top_images`` of a run of an image model (a run directory, or ``run_examples``' result to draw
    several units of one run): its first ``shown`` kept top samples (default all), their inputs and
    the unit's maps as the run kept them."""
    run = run if isinstance(run, RunExamples) else run_examples(run)
    row = unit_row(units, layer, unit)
    kept = run.of(row, shown)
    maps = None if kept["map"].iloc[0] is None else np.stack(kept["map"].to_list())
    names = [run.names.get((row.hook, int(s)), ("", "")) for s in kept["sample"]]
    return top_images(units, layer, unit, run.images(row.hook, kept["sample"]), maps, names)


def top_tokens_of_run(run: str | Path | RunExamples, units: pd.DataFrame, layer: str, unit: int,
                      shown: int | None = None) -> Figure:
    """``top_tokens`` of a run of a token model: its first ``shown`` kept top sequences, each token
    shown as its id."""
    run = run if isinstance(run, RunExamples) else run_examples(run)
    row = unit_row(units, layer, unit)
    samples = run.of(row, shown)["sample"].tolist()
    tokens = {int(s): run.input_of(row.hook, int(s)) for s in samples}
    return top_tokens(units, layer, unit, tokens, lambda ids: [str(i) for i in ids], shown=len(samples))


def top_images(units: pd.DataFrame, layer: str, unit: int, images: np.ndarray, maps: np.ndarray | None,
               names: Sequence[tuple[str, str]] | None = None, ncols: int = 4) -> Figure:
    """The unit's top images (``images``: ``[k, H, W, 3]`` in [0, 1], in ``top_sample`` order) with its
    ``maps`` (``[k, h, w]``) over them: a heat whose opacity grows with the map's value (transparent at the
    lowest value of the shown maps, so the image stays legible where the unit is quiet), an outline where
    the map is above half its range over the shown maps, and a cross where this image's maximum was
    (``maps=None``: a unit without a map, such as a feature of a linear output; the images alone).
    ``names``: each image's ``(name, class)`` (``load_unit_names``; ``""``: its sample id names it)."""
    row = unit_row(units, layer, unit)
    k = len(images)
    names = list(names) if names is not None else [("", "")] * k
    nrows = math.ceil(k / ncols)
    fig = Figure(figsize=(2.4 * ncols, 2.6 * nrows + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).reshape(-1)
    span = _span(maps) if maps is not None else None
    for i, ax in enumerate(axes):
        ax.set_axis_off()
        if i >= k:
            continue
        ax.imshow(images[i], extent=(0, images.shape[2], images.shape[1], 0))  # the overlay's extent: aligned
        said = example_name(int(row.top_sample[i]), *names[i]) if row.get("named") in (None, True) else UNNAMED
        ax.set_title(f"{said}: {row.top_value[i]:.3g}", fontsize=9)
        if maps is not None:
            shown = _overlay(ax, images[i], maps[i], int(row.top_position[i]), span, list(row.position_shape))
    if maps is not None:
        fig.colorbar(shown, ax=axes.tolist(), shrink=0.6, label=f"{layer} unit {unit}'s map (opaque: high)")
        fig.legend(handles=_legend(), loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    classes = classes_said([label for _, label in names])
    fig.suptitle(f"{layer} unit {unit}: its top {k} inputs{', ' + classes if classes else ''} "
                 f"(unit mean {row['mean']:.3g}, max {row['max']:.3g})", fontsize=11)
    return fig


def example_name(sample: int, name: str, label: str) -> str:
    """A top example as its user knows it: the file's path (with its class when the path does not begin
    with the class folder), or its sample id (its dataset index), with its class when the data give one.
    A sample of data that cannot name it (``named`` false) is ``unnamed`` (``top_images``)."""
    named = name or f"sample {sample}"
    return named if not label or named.startswith(f"{label}/") else f"{named} (class {label})"


#: The overlay's colours: the heat's hue (its opacity rises with the value), the outline and the cross.
HEAT, OUTLINE, CROSS = "#ff1f8e", "white", "#00e5ff"
#: The heat's largest opacity, and the fraction of the maps' range the outline is drawn at.
MOST_OPAQUE, OUTLINE_AT = 0.5, 0.5


def _span(maps: np.ndarray) -> tuple[float, float]:
    """The shown maps' lowest and highest finite values (the heat's and the outline's scale)."""
    finite = maps[np.isfinite(maps)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return low, high if high > low else low + 1.0


def _heat_colours():
    from matplotlib.colors import LinearSegmentedColormap, to_rgb

    red, green, blue = to_rgb(HEAT)
    return LinearSegmentedColormap("unit heat", {"red": [(0, red, red), (1, red, red)],
                                                 "green": [(0, green, green), (1, green, green)],
                                                 "blue": [(0, blue, blue), (1, blue, blue)],
                                                 "alpha": [(0, 0, 0), (1, MOST_OPAQUE, MOST_OPAQUE)]})


def _legend() -> list:
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=OUTLINE, lw=1.5, path_effects=_edged(), label=f"outline: the map above "
                   f"{OUTLINE_AT:.0%} of its range over these images"),
            Line2D([], [], color=CROSS, marker="+", ls="", markersize=10, markeredgewidth=2,
                   label="cross: where this image's maximum (its value) was")]


def _edged() -> list:
    from matplotlib import patheffects

    return [patheffects.withStroke(linewidth=2.6, foreground="black")]


def _overlay(ax, image: np.ndarray, unit_map: np.ndarray, position: int, span: tuple[float, float],
             positions: list[int]):
    """``unit_map`` over ``image`` on ``ax`` as a heat (transparent at ``span``'s low end), an outline at
    ``OUTLINE_AT`` of ``span``, and a cross where the maximum was (``position``, flat in the layer's
    ``positions`` ``[h, w]``, which the kept map may pool)."""
    height, width = image.shape[:2]
    low, high = span
    shown = ax.imshow(unit_map, cmap=_heat_colours(), vmin=low, vmax=high, extent=(0, width, height, 0),
                      interpolation="bilinear")
    rows, columns = unit_map.shape
    level = low + OUTLINE_AT * (high - low)
    if np.isfinite(unit_map).all() and unit_map.min() < level < unit_map.max():
        # each value at its position's centre, the edges' values out to the image's edges
        xs = np.concatenate([[0], (np.arange(columns) + 0.5) * width / columns, [width]])
        ys = np.concatenate([[0], (np.arange(rows) + 0.5) * height / rows, [height]])
        ax.contour(xs, ys, np.pad(unit_map, 1, mode="edge"), levels=[level], colors=OUTLINE,
                   linewidths=1.5).set(path_effects=_edged())
    h, w = positions
    y, x = divmod(position, w)
    ax.plot((x + 0.5) * width / w, (y + 0.5) * height / h, "+", color=CROSS, markersize=12, markeredgewidth=2)
    return shown


def top_tokens(units: pd.DataFrame, layer: str, unit: int, tokens: np.ndarray | Mapping[int, np.ndarray],
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
    fig = Figure(figsize=(9, 2.1 * len(layers) + 0.6), layout="constrained")
    axes = np.array(fig.subplots(len(layers), 2, squeeze=False))
    for (mean_ax, dead_ax), layer in zip(axes, layers):
        rows = units[units.layer == layer]
        dead = 1 - rows.fraction_above
        mean_ax.hist(rows["mean"][np.isfinite(rows["mean"])], bins=bins, color="tab:blue")  # a NaN mean: no bar
        dead_ax.hist(dead, bins=np.linspace(0, 1, bins + 1), color="tab:red")
        threshold = rows.threshold.iloc[0]
        mean_ax.set_title(f"{layer}: mean over the dataset, of {len(rows)} units", fontsize=9)
        dead_ax.set_title(f"{layer}: dead fraction (values <= {threshold:g}); {(dead >= 1).sum()} never above",
                          fontsize=9)
        mean_ax.set_ylabel("units", fontsize=9)
    axes[-1, 0].set_xlabel("unit mean over the dataset")
    axes[-1, 1].set_xlabel("dead fraction (values <= threshold)")
    fig.suptitle("Units per layer: how many units have each mean (blue) and each dead fraction (red)")
    return fig
