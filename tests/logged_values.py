"""What a live logger must have logged, computed in the test from the run's parquet files
(``load_stats``/``load_steps``), to compare with what each tool's own reader reads back."""
from __future__ import annotations

import math

import runner.analysis as analysis

#: The loggers' default statistics per kind.
DEFAULT_STATS = {"output": ["std"], "grad_output": ["l2"], "param_grad": ["l2"]}


def expected_scalars(run_dir, entries=("stats",), stats=None, every=1) -> dict[tuple[int, str], float]:
    """``{(step, tag): value}``: the loss and measures of ``steps.parquet``, and ``stats`` of ``entries``'
    rows of ``stats.parquet``, as ``SPLIT/...`` tags (the export's naming), for steps ``every`` divides."""
    stats = stats or DEFAULT_STATS
    out = {}
    steps = analysis.load_steps(run_dir)
    for row in steps.to_dict("records"):
        for name in ("loss", "accuracy"):
            value = row.get(name)
            if value is not None and not math.isnan(value) and row["step"] % every == 0:
                out[(row["step"], f"{row['split']}/{name}")] = value
    rows = analysis.load_stats(run_dir)
    for row in rows[rows.hook.isin(entries) & rows.kind.isin(list(stats))].itertuples():
        if row.step % every or row.phase == "recompute":
            continue
        split = "eval" if row.phase == "eval" else "train"
        label = analysis.label_of(row.layer, row.kind, row.slot, row.call)
        for stat in stats[row.kind]:
            out[(row.step, f"{split}/{row.hook}/{label}/{row.kind}/{stat}")] = getattr(row, stat)
    return out
