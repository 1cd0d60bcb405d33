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
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from omegaconf import DictConfig

from common.errors import ConfigError
from common.records import EXPLAINED_CLASSES
from runner.analysis import lens  # noqa: F401  (registers the logit_lens picture)
from runner.analysis.gradcam import cam_layers, explained_class, grad_cam, model_input_images
from common.run_config import saved_config_path
from runner.analysis.load import load_stats, load_tensors, override_columns, overrides_of, per_layer
from runner.analysis.order import in_job_order
from runner.analysis.patching_plots import patching_heatmap  # noqa: F401  (runner.plots.patching_heatmap)
from runner.config.registry import PLOTS
from common.manifest import read_manifest

#: Dots per inch of every saved picture: a figure of W x H inches is W*DPI x H*DPI pixels.
DPI = 100
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

    The tutorials' 8x8 layout by default: ``ncols`` x ``ceil(n / ncols)`` one-inch cells, each
    labelled with its channel index, on one shared colour scale with its colour bar (0.8 inch to
    the right), plus a 0.4-inch title band. The grid is one image (``mosaic``, maps separated by
    blank gutters), which draws in a fraction of the time of one axes per channel.
    """
    if tensor.ndim != 4:
        raise ValueError(f"feature_maps needs a [N, C, H, W] tensor, got shape {list(tensor.shape)}")
    maps = np.asarray(tensor[0, :channels], dtype=np.float32)
    nrows = math.ceil(len(maps) / ncols)
    width, height = ncols + 0.8, nrows + 0.4
    fig = Figure(figsize=(width, height))
    fig.suptitle(f"{title}  (sample 0, channels 0-{len(maps) - 1} of {tensor.shape[1]})".strip(),
                 y=1 - 0.08 / height, va="top")
    ax = fig.add_axes((0.02 / width, 0.02 / height, ncols / width, nrows / height))
    ax.set_axis_off()
    grid, cell = mosaic(maps, ncols)
    band, w = cell[0] - maps.shape[1], maps.shape[2]
    finite = maps[np.isfinite(maps)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    shown = ax.imshow(grid, cmap="viridis", interpolation="nearest", vmin=lo, vmax=hi, aspect="auto")
    for i in range(len(maps)):
        row, col = divmod(i, ncols)
        ax.text((col * cell[1] + w / 2) - 0.5, row * cell[0] + band / 2 - 0.5, f"ch {i}", fontsize=7,
                ha="center", va="center")
    bar = fig.add_axes(((ncols + 0.08) / width, 0.1 * nrows / height, 0.12 / width, 0.8 * nrows / height))
    fig.colorbar(shown, cax=bar).set_label("activation", fontsize=8, labelpad=2)
    bar.tick_params(labelsize=7)
    return fig


def mosaic(maps: np.ndarray, ncols: int) -> tuple[np.ndarray, tuple[int, int]]:
    """``[C, H, W]`` maps tiled row by row into one ``float32`` image with NaN gutters; also the cell size.

    Each cell is ``H * 1.3`` by ``W * 1.1`` pixels (the map at its bottom-left, a band above it for
    the label, a gutter right of it), so map ``i`` starts at row ``(i // ncols) * cell_h + band``.
    """
    _, h, w = maps.shape
    band, gutter = max(1, round(0.3 * h)), max(1, round(0.1 * w))
    cell = (h + band, w + gutter)
    nrows = math.ceil(len(maps) / ncols)
    grid = np.full((nrows * cell[0], ncols * cell[1]), np.nan, dtype=np.float32)
    for i, m in enumerate(maps):
        row, col = divmod(i, ncols)
        grid[row * cell[0] + band:row * cell[0] + band + h, col * cell[1]:col * cell[1] + w] = m
    return grid, cell


def gradient_flow(stats: pd.DataFrame, step: int | None = None, title: str = "") -> Figure:
    """Mean, std and abs-max of each recorded kind per layer, in depth order, for one run.

    One row of panels per kind (activations ``output``, gradients ``grad_output`` /
    ``param_grad``, ...): the mean on a symmetric-log axis (signs show, values spanning decades
    stay apart, and means below 1% of the median std are drawn linearly, as the noise they are),
    std and abs-max on a log axis, where vanishing or exploding gradients show as a slope across
    depth. Deep models are labelled by block (the
    ticks mark where ``layer1.0``, ``layer1.1``, ... start). 12 inches wide, 3.2 per row.

    Raises:
        ValueError: the rows hold no activation or gradient statistics (e.g. ``hooks=none``).
    """
    if stats["run_dir"].nunique() > 1:
        raise ValueError("gradient_flow draws one run; filter by run_dir, or use compare_runs for a sweep")
    panels = [(kind, per_layer(stats, kind, step)) for kind in _KIND_ORDER if (stats["kind"] == kind).any()]
    if not panels:
        raise ValueError("gradient_flow: the run recorded no activation or gradient statistics "
                         "(record some with hooks=stats)")
    fig = Figure(figsize=(12, 3.2 * len(panels)), layout="constrained")
    fig.suptitle(title or "per-layer statistics across depth")
    axes = fig.subplots(len(panels), 2, squeeze=False)
    for (kind, rows), (ax_mean, ax_spread) in zip(panels, axes):
        x = np.arange(len(rows))
        line = {"marker": ".", "markersize": 5 if len(rows) <= 40 else 2.5, "linewidth": 1}
        ax_mean.plot(x, rows["mean"], color="tab:blue", **line)
        ax_mean.axhline(0, color="grey", linewidth=0.5)
        spread = rows["std"][lambda v: (v > 0) & np.isfinite(v)]
        if not spread.empty:
            _symlog(ax_mean, 0.01 * float(spread.median()), rows["mean"])
        ax_mean.set_ylabel(f"{kind}\nmean" + (" (symlog)" if ax_mean.get_yscale() == "symlog" else ""))
        ax_spread.plot(x, rows["std"], label="std", **line)
        ax_spread.plot(x, rows["abs_max"], label="abs max", **line)
        if (rows[["std", "abs_max"]] > 0).any().any():
            ax_spread.set_yscale("log")
        ax_spread.set_ylabel(f"{kind}\nstd, abs max (log)")
        ax_spread.legend(fontsize="small")
        for ax in (ax_mean, ax_spread):
            _depth_ticks(ax, rows["label"])
    return fig


def compare_runs(stats: pd.DataFrame, stat: str = "l2", kind: str = "param_grad", step: int | None = None,
                 by: list[str] | None = None) -> Figure:
    """One statistic per layer with one line per run of a sweep (e.g. gradient norm per clip value).

    Parameter gradients get one panel per parameter kind (``weight`` kernels and matrices,
    1-D ``weight`` vectors such as norm scales, ``bias`` vectors), so a line never alternates
    between kinds of different scale. Lines are labelled by ``by`` (columns of the frame), or by
    the override columns whose values differ between runs, in job order (the order of the values
    on the command line), each its own colour. The y axis is logarithmic when every value is positive. 12 inches wide, 1 + 3.2 per panel.
    """
    rows = per_layer(stats, kind, step)
    if rows.empty:
        raise ValueError(f"compare_runs: no rows of kind '{kind}'; kinds present: {sorted(stats['kind'].unique())}")
    by = by or _varying_overrides(stats)
    if kind == "param_grad":
        rows = rows.assign(panel=[f"{slot} gradients, " + ("kernels and matrices" if len(shape) > 1 else "vectors")
                                  for slot, shape in zip(rows["slot"], rows["tensor_shape"])])
        x_of = rows["layer"]
    else:
        rows = rows.assign(panel=f"{kind}")
        x_of = rows["label"]
    rows = rows.assign(x_name=x_of.to_numpy())
    if "model" in rows.columns and rows["model"].astype(str).nunique() > 1:  # their layers never share an axis
        rows = rows.assign(panel=[f"model={m}: {p}" for m, p in zip(rows["model"].astype(str), rows["panel"])])
    panels = list(dict.fromkeys(rows["panel"]))
    fig = Figure(figsize=(12, 1 + 3.2 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    runs = _ordered_runs(rows, by)
    colours = _colours(len(runs))
    for ax, panel in zip(axes, panels):
        mine = rows[rows["panel"] == panel]
        order = list(dict.fromkeys(mine["x_name"]))
        for colour, (label, run) in zip(colours, runs):
            run = run[run["panel"] == panel]
            ax.plot([order.index(n) for n in run["x_name"]], run[stat], marker=".", markersize=3, linewidth=1,
                    color=colour, label=label)
        if (mine[stat] > 0).all():
            ax.set_yscale("log")
        ax.set_ylabel(f"{stat}" + (" (log)" if ax.get_yscale() == "log" else ""))
        ax.set_title(panel, fontsize="medium", loc="left")
        _depth_ticks(ax, order, most=24)
    fig.suptitle(f"{kind} {stat} per layer, one line per run")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small",
               title=", ".join(by) if by else "overrides", title_fontsize="small")
    return fig


def loss_curves(steps: pd.DataFrame, by: list[str] | None = None, metrics: Sequence[str] = ("loss",),
                splits: Sequence[str] = ("train", "eval")) -> Figure:
    """Each of ``metrics`` (``loss``, ``accuracy``) per step, one panel each, one colour per run
    (``load_steps``'s frame): train solid, eval dashed, of the ``splits`` asked for. 8 x 4 inches for
    one panel, 5.5 x 4 for each of more."""
    by = by or _varying_overrides(steps)
    fig = Figure(figsize=(8 if len(metrics) == 1 else 5.5 * len(metrics), 4), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    has_split = "split" in steps.columns
    both = has_split and len(splits) > 1 and (steps["split"] == "eval").any()
    runs = _ordered_runs(steps, by)
    for ax, metric in zip(axes, metrics):
        for colour, (label, run) in zip(_colours(len(runs)), runs):
            for split, style in (("train", "-"), ("eval", "--")):
                part = run[run["split"] == split] if has_split else (run if split == "train" else run.iloc[:0])
                if split in splits and not part.empty:
                    ax.plot(part["step"], part[metric], style, marker=".", markersize=3, color=colour,
                            label=f"{label} ({split})" if both else label)
        positive = steps[metric].dropna()
        if len(positive) and (positive > 0).all() and positive.max() / positive.min() > 100:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        held = " (held out)" if has_split and list(splits) == ["eval"] else ""
        ax.set_ylabel(metric + held + (" (log)" if ax.get_yscale() == "log" else ""))
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    return fig


def grad_cam_overlay(image: np.ndarray, cam: np.ndarray, title: str = "") -> Figure:
    """The input image ``[H, W, 3]`` (values in [0, 1]), its Grad-CAM map ``[H, W]`` and both overlaid, with a colour bar.

    ``image`` may be ``None`` when the run stored no input: the map is drawn alone and the
    panels say so. 10 x 3.6 inches.
    """
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    fig.suptitle(title or "Grad-CAM")
    ax_img, ax_cam, ax_both = fig.subplots(1, 3)
    for ax, name in ((ax_img, "input"), (ax_both, "overlay")):
        if image is None:
            ax.text(0.5, 0.5, "the run stored\nno model input", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.imshow(image)
        ax.set_title(name)
    shown = ax_cam.imshow(cam, cmap="jet", vmin=0, vmax=1)
    ax_cam.set_title("class activation map")
    if image is not None:
        ax_both.imshow(cam, cmap="jet", vmin=0, vmax=1, alpha=0.45)
    for ax in (ax_img, ax_cam, ax_both):
        ax.set_axis_off()
    fig.colorbar(shown, ax=[ax_cam, ax_both], shrink=0.85, label="relevance (scaled to [0, 1])")
    return fig


def _symlog(ax, linthresh: float, values: pd.Series) -> None:
    """A symmetric-log y axis, linear within ``linthresh``, ticked at 0 and at the whole decades beyond it."""
    ax.set_yscale("symlog", linthresh=linthresh, linscale=1.5)
    finite = values[np.isfinite(values)]
    low, high = min(float(finite.min()), 0.0), max(float(finite.max()), 0.0)
    first = math.floor(math.log10(linthresh)) + 1
    last = math.ceil(math.log10(max(-low, high, linthresh)))
    decades = [10.0 ** k for k in range(first, last + 1)]
    ax.set_yticks([-d for d in reversed(decades) if -d >= 2 * low] + [0.0] + [d for d in decades if d <= 2 * high])


def block_of(label: str) -> str:
    """The block a layer label belongs to: up to its first numeric part (``layer1.0``), else its first part."""
    parts = label.split(" #")[0].split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return parts[0]


def _depth_ticks(ax, labels, most: int = 40) -> None:
    """Every label as a tick when there are few; else one tick where each block starts, with a thin divider."""
    labels = list(labels)
    ax.set_xlim(-0.5, max(len(labels), 1) - 0.5)
    ax.grid(True, axis="y", alpha=0.3)
    if len(labels) <= most:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        return
    blocks = [block_of(label) for label in labels]
    starts, gap = [], len(labels) / most  # a block starting too close to the last tick shares it
    for i, block in enumerate(blocks):
        if (i == 0 or block != blocks[i - 1]) and (not starts or i - starts[-1] >= gap):
            starts.append(i)
    ax.set_xticks(starts, [blocks[i] for i in starts], rotation=90, fontsize=7)
    for i in starts[1:]:
        ax.axvline(i - 0.5, color="grey", linewidth=0.4, alpha=0.5)
    ax.set_xlabel(f"depth: {len(labels)} layers, ticks where each block starts", fontsize=8)


def _ordered_runs(rows: pd.DataFrame, by: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(label, rows)`` per run in job order: the order of the swept values on the command line."""
    position = {run: i for i, run in enumerate(in_job_order(rows["run_dir"]))}
    runs = sorted(rows.groupby("run_dir", sort=False, observed=True), key=lambda item: position[item[0]])
    return [(_run_label(run.iloc[0], by), run) for _, run in runs]


def _colours(n: int) -> list:
    from matplotlib import colormaps

    return [colormaps["tab10"](i) for i in range(n)] if n <= 10 else \
        [colormaps["viridis"](i / max(n - 1, 1)) for i in range(n)]


def _run_label(first: pd.Series, by: list[str]) -> str:
    if by:
        return ", ".join(f"{c}={first[c]}" for c in by)
    own = " ".join(f"{k}={v}" for k, v in overrides_of(Path(str(first["run_dir"]))).items())
    return own or Path(str(first["run_dir"])).name


def _varying_overrides(frame: pd.DataFrame) -> list[str]:
    per_run = frame.drop_duplicates("run_dir")
    return [c for c in override_columns(frame) if per_run[c].astype(str).nunique() > 1]


def run_config(run_dir: str | Path) -> DictConfig | None:
    """The config saved in the run directory (``config.yaml``, else ``.hydra/config.yaml``), or ``None``."""
    from omegaconf import OmegaConf

    path = saved_config_path(run_dir)
    return None if path is None else OmegaConf.load(path)


def run_title(cfg: DictConfig | None, run_dir: str | Path) -> str:
    """What a run is, for a picture's title (``resnet50, hooks stats``); its directory when it saved no config."""
    if cfg is None:
        return Path(run_dir).name
    model = (cfg.get("model") or {}).get("name") or "own model"
    entries = [name if entry.get("type") == name else f"{name} ({entry.get('type')})"
               for name, entry in (cfg.get("hooks") or {}).items()]
    return f"{model}, hooks {', '.join(entries)}" if entries else f"{model}, no hooks"


def run_figures(run_dir: str | Path, names, cfg: DictConfig | None = None,
                step: int = 0) -> tuple[list[tuple[str, Figure]], list[str]]:
    """Draw the pictures ``names`` (of ``PLOTS``) of one run: ``([(file name, figure)], [why something was not drawn])``.

    Everything is read from the run directory: statistics, kept tensors, the model input the run
    stored for Grad-CAM and the config saved beside them (``cfg`` stands in only where the
    directory has none yet). ``feature_maps`` and ``grad_cam`` draw one picture per captured 4-D
    layer (first call of ``step``). A picture the run's data cannot give is a note, never an error.
    """
    figures, notes = [], []
    cfg = run_config(run_dir) or cfg
    for name in names:
        figures += PLOTS.get(name).build.draw(run_dir, cfg, step, notes)
    return figures, notes


class Picture:
    """A picture ``plots: [NAME]`` asks for, registered with ``@PLOTS.register(NAME)``: what records it
    needs (``missing``, asked by the plan before the run) and how it is drawn from the run's files (``draw``)."""

    #: The run stores its model input for this picture (Grad-CAM's underlay).
    keeps_input = False

    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        """What the run's entries (``HookType``s) and loss lack to give this picture, or ``None``."""
        return None

    @staticmethod
    def draw(run_dir: str | Path, cfg: DictConfig | None, step: int, notes: list[str]) -> list[tuple[str, Figure]]:
        """The ``(file name, figure)``s of the run at ``run_dir``; what it cannot draw goes to ``notes``."""
        raise NotImplementedError


def _kept(hooks) -> list[frozenset]:
    return [hook.expected_kinds for hook in hooks if hook.keep]


def _step_tensors(run_dir: str | Path, step: int) -> pd.DataFrame:
    return load_tensors(run_dir, filters=[("step", "=", step), ("call", "=", 0),
                                          ("kind", "in", ["output", "grad_output", "model_input"])])


@PLOTS.register("gradient_flow")
class GradientFlowPicture(Picture):
    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        return None if hooks else "recorded statistics; add hooks, e.g. hooks=stats"

    @staticmethod
    def draw(run_dir, cfg, step, notes):
        stats = load_stats(run_dir, filters=[("phase", "!=", "eval")])
        try:
            return [("gradient_flow.png", gradient_flow(stats, title=f"{run_title(cfg, run_dir)}: "
                                                        "per-layer statistics across depth"))]
        except ValueError as exc:
            notes.append(str(exc))
            return []


@PLOTS.register("feature_maps")
class FeatureMapsPicture(Picture):
    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        if any("output" in kinds for kinds in _kept(hooks)):
            return None
        return "a kept conv output; add hooks=extract or hooks=gradcam and name a conv layer in its layers"

    @staticmethod
    def draw(run_dir, cfg, step, notes):
        tensors = _step_tensors(run_dir, step)
        outputs = tensors[(tensors["kind"] == "output") & (tensors["tensor"].map(np.ndim) == 4)]
        if outputs.empty:
            notes.append(f"feature_maps: no kept 4-D output at step {step}")
        return [(f"feature_maps_{_file_part(layer)}.png", feature_maps(row["tensor"], title=layer))
                for layer, row in outputs.drop_duplicates("layer").set_index("layer").iterrows()]


@PLOTS.register("grad_cam")
class GradCamPicture(Picture):
    keeps_input = True

    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        if loss_fn is not None and any({"output", "grad_output"} <= kinds for kinds in _kept(hooks)):
            return None
        return "a conv layer's kept output and output gradient and a loss; use hooks=gradcam loss=class_score"

    @staticmethod
    def draw(run_dir, cfg, step, notes):
        chosen = (read_manifest(Path(run_dir)) or {}).get(EXPLAINED_CLASSES) if step == 0 else None
        return _grad_cam_figures(_step_tensors(run_dir, step), cfg, step, notes, chosen[0] if chosen else None)


def _grad_cam_figures(tensors: pd.DataFrame, cfg: DictConfig | None, step: int, notes: list[str],
                      chosen: int | None) -> list[tuple[str, Figure]]:
    """One picture per layer; ``chosen``: the class the loss took for sample 0 (``explained_class``)."""
    layers = cam_layers(tensors)
    if not layers:
        notes.append(f"grad_cam: no layer with a kept 4-D output and output gradient at step {step}")
        return []
    try:
        images = model_input_images(tensors, cfg, step)
    except ValueError:  # the picture says the input is missing; the map itself is all there
        images = None
    explained = explained_class(cfg, chosen)
    figures = []
    for hook, layer in layers:
        rows = tensors[(tensors["hook"] == hook) & (tensors["layer"] == layer)].set_index("kind")["tensor"]
        size = images.shape[1:3] if images is not None else rows["output"].shape[2:]
        cams = grad_cam(rows["output"], rows["grad_output"], size)
        figures.append((f"grad_cam_{_file_part(layer)}.png", grad_cam_overlay(
            None if images is None else images[0], cams[0],
            title=f"Grad-CAM of {layer} for {explained} (sample 0, step {step})")))
    return figures


def write_plots(run_dir: str | Path, names: Sequence[str]) -> list[Path]:
    """Draw the pictures ``names`` (checked by the run's plan) into ``run_dir`` as PNGs, from its files only;
    a picture the run's data cannot give is a ``ConfigError``."""
    figures, notes = run_figures(run_dir, names)
    written = [save_png(fig, Path(run_dir) / name) for name, fig in figures]
    if notes:
        raise ConfigError("plots: " + "; ".join(notes))
    return written


def _file_part(layer: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", layer) or "model"
