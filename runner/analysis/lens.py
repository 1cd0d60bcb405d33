"""The logit lens read back: ``lens.parquet`` as a frame, and its picture (blocks x positions).

``load_lens(path)`` gives the rows a ``logit_lens`` entry wrote (``common.records.LENS_SCHEMA``), of one
run or of every job of a sweep (with the jobs' overrides); ``logit_lens_picture`` draws, for one step,
the target token's probability and rank per block (rows, in depth order) and position (columns),
averaged over the samples: where in depth the model comes to predict the target. ``plots=[logit_lens]``
draws it into the run directory (``logit_lens.png``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from common.records import LENS
from hooks.specs import HOOK_TYPES
from runner.analysis.load import load_table
from runner.config.registry import PLOTS

#: The picture's name (``plots=[logit_lens]``), which the type writing ``lens.parquet`` declares its own
#: (``HookSpec.pictures``).
PICTURE = "logit_lens"


def load_lens(path: str | Path) -> pd.DataFrame:
    """The logit-lens rows of the run at ``path`` or of every run under it; an error if none wrote any."""
    rows = load_table(path, LENS)
    if rows.empty:
        raise FileNotFoundError(f"no run at or under '{path}' wrote {LENS} (add hooks=logit_lens, model=gpt2_tiny)")
    return rows


def logit_lens_picture(rows: pd.DataFrame, step: int = 0, title: str = "") -> Figure:
    """Two panels over blocks x positions of one run's ``step``: the target's mean probability and its
    mean rank (log scale; 0, the top token, is drawn at 1/2), each cell labelled; positions without a
    target (the last, with ``target: next``) are left blank."""
    rows = rows[(rows["step"] == step) & (rows["target"] >= 0)]
    if rows.empty:
        raise ValueError(f"logit_lens: no row with a target at step {step}")
    if rows["run_dir"].nunique() > 1:
        raise ValueError("logit_lens_picture draws one run; filter by run_dir")
    means = rows.groupby(["block", "layer", "position"], observed=True)[["target_prob", "target_rank"]].mean()
    prob = means["target_prob"].unstack("position")
    rank = means["target_rank"].unstack("position")
    labels = [layer for _, layer in prob.index]
    positions = list(prob.columns)
    fig = Figure(figsize=(max(7.0, 0.5 * len(positions) + 2.5), 2 * (0.45 * len(labels) + 1.3)), layout="constrained")
    fig.suptitle(title or f"logit lens: the target token per block and position (step {step}, mean over samples)")
    for ax, grid, label, kwargs, text in zip(
            fig.subplots(2, 1),
            (prob.to_numpy(), rank.to_numpy()),
            ("target probability", "target rank (0 = top token; log scale)"),
            ({"cmap": "viridis", "vmin": 0.0, "vmax": max(float(np.nanmax(prob.to_numpy())), 1e-9)},
             {"cmap": "viridis_r", "norm": LogNorm(vmin=0.5, vmax=max(float(np.nanmax(rank.to_numpy())), 1.0))}),
            ("{:.3f}", "{:.3g}")):
        shown = grid if label.startswith("target probability") else np.maximum(grid, 0.5)
        image = ax.imshow(shown, aspect="auto", interpolation="nearest", **kwargs)
        for (row, col), value in np.ndenumerate(grid):
            if np.isfinite(value):
                red, green, blue, _ = image.cmap(image.norm(shown[row, col]))
                ax.text(col, row, text.format(value), ha="center", va="center", fontsize=6,
                        color="black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white")
        ax.set_xticks(range(len(positions)), [str(p) for p in positions])
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlabel("position")
        ax.set_ylabel("block")
        fig.colorbar(image, ax=ax, label=label.split(" (")[0])
        ax.set_title(label, fontsize=9)
    return fig


@PLOTS.register(PICTURE)
class LogitLensPicture:
    """``plots=[logit_lens]`` (the interface of ``runner.analysis.plots.Picture``, which imports this module)."""

    keeps_input = False

    @staticmethod
    def missing(hooks, loss_fn) -> str | None:
        if any(LENS in hook.writes for hook in hooks):
            return None
        return "a logit_lens entry; add hooks=logit_lens (a causal language model: model=gpt2_tiny)"

    @staticmethod
    def draw(run_dir, cfg, step, notes):
        try:
            return [("logit_lens.png", logit_lens_picture(load_lens(run_dir), step))]
        except FileNotFoundError:  # said only of a run that had a lens entry: the others were never to draw it
            if _drawn_from_an_entry_of(cfg):
                notes.append(f"{PICTURE}: the run wrote no {LENS}")
        except ValueError as exc:
            notes.append(str(exc))
        return []


def _drawn_from_an_entry_of(cfg) -> bool:
    """Whether the run (its saved config ``cfg``) had an entry whose type declares this picture its own."""
    specs = [HOOK_TYPES.schema_of((entry or {}).get("type")) for entry in (cfg or {}).get("hooks", {}).values()]
    return any(spec is not None and PICTURE in spec.pictures for spec in specs)
