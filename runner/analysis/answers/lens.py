"""The answer of a ``logit_lens`` entry: the block at which the target token first ranks first.

Per block (in depth order) the share of readings (step, sample, position with a target) in which the
target ranks first, its mean rank and probability; the headline names the first block at which it
ranks first in most readings.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from runner.analysis.answers import Answer
from runner.analysis.lens import load_lens


def lens_table(path: str | Path, entry: str | None = None) -> pd.DataFrame:
    """One row per block of the lens rows at ``path`` (of entry ``entry``, or all): ``block``, ``layer``,
    ``ranks_first`` (the share of readings in which the target is the top token), ``mean_rank``,
    ``mean_prob``, ``readings``."""
    rows = load_lens(path)
    rows = rows[(rows["target"] >= 0) & ((rows["hook"] == entry) if entry else True)]
    return rows.assign(first=rows["target_rank"] == 0).groupby(["block", "layer"], observed=True).agg(
        ranks_first=("first", "mean"), mean_rank=("target_rank", "mean"), mean_prob=("target_prob", "mean"),
        readings=("first", "size")).reset_index()


def lens_answer(run_dir: Path, entry: str) -> Answer | None:
    """The first block at which the target ranks first in most readings, then each block's share; ``None``
    when the run wrote no lens row."""
    try:
        table = lens_table(run_dir, entry)
    except FileNotFoundError:  # no lens row at all
        return None
    if table.empty:
        return None
    most = table[table["ranks_first"] > 0.5]
    first = (f"the target first ranks first at {most.layer.iloc[0]} (in {100 * most.ranks_first.iloc[0]:.0f}% of "
             f"{most.readings.iloc[0]} readings)" if len(most) else
             "the target ranks first in no block's most readings")
    shares = ", ".join(f"{row.layer} {100 * row.ranks_first:.0f}%" for row in table.itertuples())
    return Answer([first, f"share of readings where it ranks first: {shares}"], table)
