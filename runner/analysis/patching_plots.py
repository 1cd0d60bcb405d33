"""The picture of a patching table: a heatmap per method, and attribution against real patching.

``patching_heatmap`` draws ``runner.analysis.patching.patching_table``: for each method in it
(``patch``, ``attribution``, ``path``) layers (rows; a path's rows are ``sender → receiver``) x
index (columns: positions or channels, in numeric order), coloured by the recovered fraction and
each cell labelled with it; for ``steer`` (nothing to recover: no clean run) steered layers x scale,
the change of the metric the vector made (steered minus unsteered). Where an attribution run and
real patching hold the same cells, a scatter of the one against the other beside them, with their
Pearson correlation: how far the first-order estimate can stand in for the sweep it costs a fraction of.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from common.records import METHOD, METHODS
from runner.analysis.order import natural_key
from runner.analysis.patching import ESTIMATE, PATCH, PATH, SCALE, STEERING, attribution_against_patching

TITLES = {PATCH: "activation patching", ESTIMATE: "attribution patching (estimate)",
          PATH: "path patching (sender → receiver)", STEERING: "steering"}


def patching_heatmap(table: pd.DataFrame, title: str = "") -> Figure:
    """The heatmaps of ``table``'s methods, stacked, and the attribution-vs-patching scatter when both
    are there (its correlation in the scatter's title); ``title`` over the whole figure."""
    table = table if METHOD in table else table.assign(**{METHOD: PATCH})  # a table made before methods
    methods = [m for m in METHODS if m in set(table[METHOD])]
    grids = {m: _grid(table[table[METHOD] == m]) for m in methods}
    both, r = attribution_against_patching(table) if {ESTIMATE, PATCH} <= set(methods) else (None, None)
    width = max(6.0, 0.55 * max(g.shape[1] for g in grids.values()) + 3)
    heights = [max(2.2, 0.55 * g.shape[0] + 1.4) for g in grids.values()]
    mosaic = [[m] + (["scatter"] if both is not None else []) for m in methods]
    fig = Figure(figsize=(width + (4.5 if both is not None else 0), sum(heights)), layout="constrained")
    axes = fig.subplot_mosaic(mosaic, height_ratios=heights,
                              width_ratios=[width, 4.5] if both is not None else None)
    metric = table.attrs.get("metric", "metric")
    for method, grid in grids.items():  # each its own colour scale: an estimate may overshoot the real cells
        image = _heatmap(axes[method], grid, max(1.0, float(np.nanmax(np.abs(grid.to_numpy(dtype=float))))))
        what = f"change of {metric}" if method == STEERING else f"recovered fraction of {metric}"
        axes[method].set_title(title if title and len(methods) == 1 else f"{TITLES.get(method, method)}: {what}")
        fig.colorbar(image, ax=axes[method], label=what.split(" of ")[0])
        if method == STEERING:
            axes[method].set_xlabel(SCALE)
            axes[method].set_ylabel("steered layer")
    if both is not None:
        _scatter(axes["scatter"], both, r)
    if title and len(methods) > 1:
        fig.suptitle(title)
    return fig


def _grid(rows: pd.DataFrame) -> pd.DataFrame:
    """Layers (a path's: ``sender → receiver``) x index, the recovered fraction, both in natural order;
    steering rows: layers x scale, the steered metric minus the unsteered."""
    rows = rows.assign(row=[layer if not isinstance(receiver, str) else f"{layer} → {receiver}"
                            for layer, receiver in zip(rows["layer"], rows.get("receiver", [None] * len(rows)))])
    if (rows[METHOD] == STEERING).all():  # a row per steered layer and index
        rows = rows.assign(row=[row if index == "all" else f"{row} [{index}]" for row, index in zip(rows["row"],
                                                                                                   rows["index"])])
        grid = rows.assign(change=rows["patched"] - rows["corrupted"]).pivot(index="row", columns=SCALE,
                                                                             values="change")
    else:
        grid = rows.pivot(index="row", columns="index", values="recovered")
    return grid.loc[sorted(grid.index, key=natural_key), sorted(grid.columns, key=natural_key)]


def _heatmap(ax, grid: pd.DataFrame, limit: float):
    values = grid.to_numpy(dtype=float)
    image = ax.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    for (row, col), value in np.ndenumerate(values):
        ax.text(col, row, f"{value + 0.0:.2f}", ha="center", va="center", fontsize=7,
                color="white" if abs(value) > 0.6 * limit else "black")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index])
    ax.set_xlabel("patched index (position or channel)")
    ax.set_ylabel("patched layer")
    return image


def _scatter(ax, both: pd.DataFrame, r: float) -> None:
    """Attribution's estimate (y) against real patching (x), one dot per cell, and the line y = x."""
    ax.scatter(both[PATCH], both[ESTIMATE], s=14, alpha=0.8)
    low = float(min(both[PATCH].min(), both[ESTIMATE].min(), 0.0))
    high = float(max(both[PATCH].max(), both[ESTIMATE].max(), 1.0))
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8, linestyle="--", label="y = x")
    ax.set_xlabel("recovered, real patching")
    ax.set_ylabel("recovered, attribution estimate")
    ax.set_title(f"estimate against patching\nr = {r:.3f} over {len(both)} cells")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
