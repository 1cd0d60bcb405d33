"""The answer of a ``units`` entry: per layer, the units that respond most strongly over the pass (largest
max) with the inputs they respond to, named as the user knows them, and how many units are dead.

The lines are read from ``runner.analysis.units.top_units``' table (the Answer's ``table``), one layer
after another: a line for the layer (its units, those never above the threshold), then one per top unit
(its max and mean, its dead fraction, its top inputs with their value, and the classes they fall in).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.records import UNITS
from runner.analysis.answers import Answer
from runner.analysis.answers.statistics import percent
from runner.analysis.units import classes_said, top_units
from common.ranks import rank_files

#: Top units per layer, and their first top inputs, named on the terminal and in the table.
UNITS_SHOWN = 3
INPUTS_SHOWN = 4
#: Layers given lines (in the model's order); the table holds every layer.
MOST_LAYERS = 6


def answer(run_dir: Path, entry: str) -> Answer | None:
    """The top units of entry ``entry`` of the run at ``run_dir``; ``None`` when it wrote no units."""
    if not rank_files(run_dir, UNITS):
        return None
    table = top_units(run_dir, k=UNITS_SHOWN, examples=INPUTS_SHOWN)
    table = table[table.hook == entry].reset_index(drop=True)
    if table.empty:
        return None
    return Answer(lines(table, run_dir), table)


def lines(table: pd.DataFrame, run_dir: Path) -> list[str]:
    """The terminal's lines of a ``top_units`` table of one entry of the run at ``run_dir``."""
    layers = list(table.groupby(["layer", "call"], sort=False))
    out = [f"the {UNITS_SHOWN} units of each layer with the largest response (max over positions) and their "
           f"top inputs (top_units({str(run_dir)!r})):"]
    for (layer, call), rows in layers[:MOST_LAYERS]:
        first = rows.iloc[0]
        named = layer if call == 0 else f"{layer} (call {call})"
        out.append(f"{named}: {first.layer_units} units, {first.layer_dead_units} dead (never above the threshold)")
        for unit, examples in rows.groupby("unit_rank", sort=True):
            row = examples.iloc[0]
            inputs = ", ".join(f"{name} {value:.3g}" for name, value in zip(examples.input, examples.value))
            out.append(f"  unit {row.unit}: max {row['max']:.3g}, mean {row['mean']:.3g}, "
                       f"dead {percent(row.dead_fraction)}; top inputs {inputs}{_in_parentheses(classes_said(list(examples['class'])))}")
    if len(layers) > MOST_LAYERS:
        out.append(f"... and {len(layers) - MOST_LAYERS} more layer(s): top_units(RUN_DIR) holds them all")
    return out


def _in_parentheses(text: str) -> str:
    return f" ({text})" if text else ""
