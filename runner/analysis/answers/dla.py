"""The answer of a ``dla`` entry: which parts of the residual stream push the logit difference, and that they add up.

Each part's contribution is averaged over the readings (step, sample, position) the entry made; the
headline names the logit difference and the parts with the largest mean contributions (by size), the
next line the largest heads, and the last checks, reading by reading, that the parts of
``common.records.DLA_WHOLE`` (the ``bias`` term among them) sum to the model's own logit difference.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.records import DLA, DLA_WHOLE
from runner.analysis.answers import Answer
from runner.analysis.load import load_table

#: How many parts and heads the lines name.
TOP = 5
READING = ["step", "sample", "position"]


def part_name(component: str, layer: str, head: int) -> str:
    return component if not layer else f"{layer} head {head}" if component == "head" else f"{layer} {component}"


def dla_table(path: str | Path, entry: str | None = None) -> pd.DataFrame:
    """One row per part of the ``dla`` rows at ``path`` (of entry ``entry``, or all): ``component``, ``layer``,
    ``block``, ``head``, ``part`` (its name), ``contribution`` (the mean over readings), ``readings``,
    largest first by size."""
    rows = load_table(path, DLA)
    if rows.empty:
        return rows
    rows = rows[rows["hook"] == entry] if entry else rows
    table = rows.groupby(["component", "layer", "block", "head"], observed=True).contribution.agg(
        contribution="mean", readings="size").reset_index()
    table.insert(4, "part", [part_name(*key) for key in zip(table.component, table.layer, table["head"])])
    return table.iloc[table.contribution.abs().argsort()[::-1]].reset_index(drop=True)


def sum_gap(path: str | Path, entry: str | None = None) -> float:
    """The largest gap, over readings, between the sum of the whole's parts and the model's logit difference."""
    rows = load_table(path, DLA)
    rows = rows[(rows["hook"] == entry) if entry else True]
    whole = rows[rows.component.isin(DLA_WHOLE)].groupby(READING)
    return float((whole.contribution.sum() - whole.logit_diff.first()).abs().max())


def dla_answer(run_dir: Path, entry: str) -> Answer | None:
    """The logit difference and its largest parts, the largest heads, and how closely the parts sum to it."""
    table = dla_table(run_dir, entry)
    if table.empty:
        return None
    rows = load_table(run_dir, DLA)
    rows = rows[rows["hook"] == entry]
    target, other = int(rows.target.iloc[0]), int(rows.other.iloc[0])
    diff = rows.groupby(READING).logit_diff.first()
    whole = table[table.component.isin(DLA_WHOLE)]
    heads = table[table.component == "head"]
    listed = lambda parts: ", ".join(f"{p.part} {p.contribution:+.4g}" for p in parts.head(TOP).itertuples())  # noqa: E731
    bias = float(whole[whole.component == "bias"].contribution.iloc[0])
    return Answer([f"logit[{target}] - logit[{other}] = {diff.mean():.4g} (mean of {len(diff)} readings); "
                   f"largest parts: {listed(whole[whole.component != 'bias'])}",
                   f"largest heads: {listed(heads)}" if len(heads) else "no head rows",
                   f"the parts ({', '.join(DLA_WHOLE)}) sum to the logit difference within "
                   f"{sum_gap(run_dir, entry):.2g} in every reading; the constant (bias) term is {bias:+.4g}"], table)
