"""Pictures of a run or a sweep, drawn from the loaded parquet data (matplotlib, PNG).

Each ``draw`` function takes loaded data and returns a ``matplotlib.figure.Figure``; no pyplot
and no global backend is touched (figures render with Agg when saved), so the functions are
safe in a notebook, a script or a test. ``write_plots`` draws what ``plots: [...]`` asks for
into the run directory; ``runner.report`` embeds the same figures in its HTML page.

Example:
    >>> from runner import analysis, plots
    >>> fig = plots.gradient_flow(analysis.load_stats("outputs/runs/..."))
    >>> plots.save_png(fig, "gradient_flow.png")
"""
from __future__ import annotations

import io
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import DictConfig

from hooks.errors import ConfigError, choice_error
from runner.analysis.load import load_stats, load_tensors, per_layer
from runner.analysis.gradcam import cam_layers, grad_cam
from runner.store.outputs import STATS_SCHEMA, STEPS_SCHEMA

#: Dots per inch of every saved picture: a figure of W x H inches is W*DPI x H*DPI pixels.
DPI = 100
#: Names accepted by ``plots: [...]``.
PLOTS = ("gradient_flow", "feature_maps", "grad_cam")
#: Panel order of ``gradient_flow``: activations first, then gradients, as the data flow.
_KIND_ORDER = ("input", "output", "grad_input", "grad_output", "param_grad")


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG of exactly its size in inches times ``DPI`` pixels."""
    path = Path(path)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG bytes (for embedding in HTML)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def feature_maps(tensor: np.ndarray, title: str = "", channels: int = 64, ncols: int = 8) -> Figure:
    """Grid of the first ``channels`` feature maps of sample 0 of a ``[N, C, H, W]`` output.

    The tutorials' 8x8 layout by default: a figure of ``ncols`` x ``ceil(n / ncols)`` one-inch
    cells plus a 0.4-inch title band.
    """
    if tensor.ndim != 4:
        raise ValueError(f"feature_maps needs a [N, C, H, W] tensor, got shape {list(tensor.shape)}")
    maps = tensor[0, :channels]
    nrows = math.ceil(len(maps) / ncols)
    fig = Figure(figsize=(ncols, nrows + 0.4), layout="constrained")
    fig.suptitle(f"{title}  (sample 0, channels 0-{len(maps) - 1} of {tensor.shape[1]})".strip())
    for i, ax in enumerate(fig.subplots(nrows, ncols, squeeze=False).flat):
        ax.set_axis_off()
        if i < len(maps):
            ax.imshow(maps[i], cmap="viridis", interpolation="nearest")
    return fig


def gradient_flow(stats: pd.DataFrame, step: int | None = None, title: str = "") -> Figure:
    """Mean, std and abs-max of each recorded kind per layer, in depth order, for one run.

    One row of panels per kind (activations ``output``, gradients ``grad_output`` /
    ``param_grad``, ...): the mean on a linear axis, std and abs-max on a log axis, where
    vanishing or exploding gradients show as a slope across depth. 12 inches wide, 3.2 per row.
    """
    if stats["run_dir"].nunique() > 1:
        raise ValueError("gradient_flow draws one run; filter by run_dir, or use compare_runs for a sweep")
    panels = [(kind, per_layer(stats, kind, step)) for kind in _KIND_ORDER if (stats["kind"] == kind).any()]
    if not panels:
        raise ValueError("gradient_flow: no activation or gradient statistics in these rows")
    fig = Figure(figsize=(12, 3.2 * len(panels)), layout="constrained")
    fig.suptitle(title or "per-layer statistics across depth")
    axes = fig.subplots(len(panels), 2, squeeze=False)
    for (kind, rows), (ax_mean, ax_spread) in zip(panels, axes):
        x = np.arange(len(rows))
        ax_mean.plot(x, rows["mean"], marker=".", color="tab:blue")
        ax_mean.axhline(0, color="grey", linewidth=0.5)
        ax_mean.set_ylabel(f"{kind}\nmean")
        ax_spread.plot(x, rows["std"], marker=".", label="std")
        ax_spread.plot(x, rows["abs_max"], marker=".", label="abs max")
        if (rows[["std", "abs_max"]] > 0).any().any():
            ax_spread.set_yscale("log")
        ax_spread.legend(fontsize="small")
        for ax in (ax_mean, ax_spread):
            _layer_ticks(ax, rows["label"])
    return fig


def compare_runs(stats: pd.DataFrame, stat: str = "l2", kind: str = "param_grad", step: int | None = None,
                 by: list[str] | None = None) -> Figure:
    """One statistic per layer with one line per run of a sweep (e.g. gradient norm per clip value).

    Lines are labelled by ``by`` (columns of the frame), or by the override columns whose values
    differ between runs. The y axis is logarithmic when every value is positive. 10 x 5 inches.
    """
    rows = per_layer(stats, kind, step)
    if rows.empty:
        raise ValueError(f"compare_runs: no rows of kind '{kind}'; kinds present: {sorted(stats['kind'].unique())}")
    by = by or _varying_overrides(stats)
    order = list(dict.fromkeys(rows["label"]))
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    for _, run in rows.groupby("run_dir", sort=False):
        ax.plot([order.index(label) for label in run["label"]], run[stat], marker=".", label=_run_label(run, by))
    if (rows[stat] > 0).all():
        ax.set_yscale("log")
    ax.set_ylabel(f"{kind} {stat}")
    ax.set_title(f"{kind} {stat} per layer, one line per run")
    ax.legend(fontsize="small")
    _layer_ticks(ax, order)
    return fig


def loss_curves(steps: pd.DataFrame, by: list[str] | None = None) -> Figure:
    """The loss per step, one line per run (``load_steps``'s frame); labelled as in ``compare_runs``. 8 x 4 inches."""
    by = by or _varying_overrides(steps)
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    for _, run in steps.groupby("run_dir", sort=False):
        ax.plot(run["step"], run["loss"], marker=".", label=_run_label(run, by))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    return fig


def grad_cam_overlay(image: np.ndarray, cam: np.ndarray, title: str = "") -> Figure:
    """The input image ``[H, W, 3]`` (values in [0, 1]), its Grad-CAM map ``[H, W]`` and both overlaid."""
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    fig.suptitle(title or "Grad-CAM")
    ax_img, ax_cam, ax_both = fig.subplots(1, 3)
    ax_img.imshow(image)
    ax_img.set_title("input")
    ax_cam.imshow(cam, cmap="jet", vmin=0, vmax=1)
    ax_cam.set_title("class activation map")
    ax_both.imshow(image)
    ax_both.imshow(cam, cmap="jet", vmin=0, vmax=1, alpha=0.45)
    ax_both.set_title("overlay")
    for ax in (ax_img, ax_cam, ax_both):
        ax.set_axis_off()
    return fig


def _layer_ticks(ax, labels) -> None:
    labels = list(labels)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=max(4, min(8, 480 / max(len(labels), 1))))
    ax.grid(True, alpha=0.3)


def _run_label(run: pd.DataFrame, by: list[str]) -> str:
    first = run.iloc[0]
    return ", ".join(f"{c}={first[c]}" for c in by) if by else Path(first["run_dir"]).name


def _varying_overrides(stats: pd.DataFrame) -> list[str]:
    known = set(STATS_SCHEMA.names) | set(STEPS_SCHEMA.names) | {"run_dir", "label", "abs_max", "job"}
    per_run = stats.drop_duplicates("run_dir")
    return [c for c in stats.columns if c not in known and per_run[c].astype(str).nunique() > 1]


def display_images(cfg: DictConfig, step: int = 0) -> np.ndarray:
    """The model input of ``step`` as ``[N, H, W, 3]`` in [0, 1], rebuilt from the run's config.

    Inputs normalised with ``data.mean``/``data.std`` (``data=image``) are un-normalised; other
    inputs are scaled by their own minimum and maximum.
    """
    import torch

    from runner.sources.data import DataSource

    source = DataSource(cfg.data, cfg.model).batches(int(cfg.seed), torch.device("cpu"))
    for _ in range(step + 1):
        x = next(source).x.detach()
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"the model input has shape {list(x.shape)}, not [N, 3, H, W]: no image to overlay")
    if cfg.data.get("mean") is not None and cfg.data.get("std") is not None:
        x = x * torch.tensor(list(cfg.data.std)).view(1, 3, 1, 1) + torch.tensor(list(cfg.data.mean)).view(1, 3, 1, 1)
    else:
        x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    return x.clamp(0, 1).permute(0, 2, 3, 1).numpy()


def check_plots(cfg: DictConfig) -> list[str]:
    """The picture names of ``cfg.plots``, checked before the run: known names, and hooks that record what each needs."""
    names = cfg.get("plots") or []
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if name not in PLOTS:
            raise choice_error("plots", name, PLOTS, "plot")
    hooks = [h for h in (cfg.get("hooks") or {}).values() if h is not None]
    kept = [set(h.get("kinds") or ["output"]) for h in hooks if h.get("type") == "capture"]
    if "gradient_flow" in names and not hooks:
        raise ConfigError("plots: 'gradient_flow' needs recorded statistics; add hooks, e.g. hooks=stats")
    if "feature_maps" in names and not any("output" in k for k in kept):
        raise ConfigError("plots: 'feature_maps' needs a kept conv output; add hooks=extract or hooks=gradcam "
                          "and name a conv layer in its layers")
    if "grad_cam" in names and (not any({"output", "grad_output"} <= k for k in kept) or cfg.loss.name == "none"):
        raise ConfigError("plots: 'grad_cam' needs a conv layer's kept output and output gradient and a loss; "
                          "use hooks=gradcam loss=class_score")
    return names


def run_figures(run_dir: str | Path, names, cfg: DictConfig | None = None,
                step: int = 0) -> tuple[list[tuple[str, Figure]], list[str]]:
    """Draw the pictures ``names`` of one run: ``([(file name, figure)], [why something was not drawn])``.

    ``feature_maps`` and ``grad_cam`` draw one picture per captured 4-D layer (first call of
    ``step``); ``grad_cam`` needs ``cfg`` to rebuild the input image it overlays.
    """
    figures, notes = [], []
    if "gradient_flow" in names:
        figures.append(("gradient_flow.png", gradient_flow(load_stats(run_dir), title=f"{Path(run_dir).name}: "
                                                           "per-layer statistics across depth")))
    if "feature_maps" not in names and "grad_cam" not in names:
        return figures, notes
    tensors = load_tensors(run_dir, filters=[("step", "=", step), ("call", "=", 0),
                                             ("kind", "in", ["output", "grad_output"])])
    if "feature_maps" in names:
        outputs = tensors[(tensors["kind"] == "output") & (tensors["tensor"].map(np.ndim) == 4)]
        for layer, row in outputs.drop_duplicates("layer").set_index("layer").iterrows():
            figures.append((f"feature_maps_{_file_part(layer)}.png", feature_maps(row["tensor"], title=layer)))
        if outputs.empty:
            notes.append(f"feature_maps: no kept 4-D output at step {step}")
    if "grad_cam" in names:
        layers = cam_layers(tensors)
        if not layers:
            notes.append(f"grad_cam: no layer with a kept 4-D output and output gradient at step {step}")
        elif cfg is None:
            notes.append("grad_cam: the run's config (.hydra/config.yaml) is missing, so its input image is unknown")
        else:
            try:
                images = display_images(cfg, step)
            except ValueError as exc:  # also ConfigError: e.g. the image file is not where the run read it
                notes.append(f"grad_cam: {exc}")
                layers = []
            for hook, layer in layers:
                rows = tensors[(tensors["hook"] == hook) & (tensors["layer"] == layer)].set_index("kind")["tensor"]
                cams = grad_cam(rows["output"], rows["grad_output"], images.shape[1:3])
                figures.append((f"grad_cam_{_file_part(layer)}.png",
                                grad_cam_overlay(images[0], cams[0], title=f"Grad-CAM of {layer} (sample 0)")))
    return figures, notes


def write_plots(run_dir: str | Path, cfg: DictConfig) -> list[Path]:
    """Draw ``cfg.plots`` into ``run_dir`` as PNGs; a picture the run's data cannot give is a ``ConfigError``."""
    figures, notes = run_figures(run_dir, check_plots(cfg), cfg)
    written = [save_png(fig, Path(run_dir) / name) for name, fig in figures]
    if notes:
        raise ConfigError("plots: " + "; ".join(notes))
    return written


def _file_part(layer: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", layer) or "model"
