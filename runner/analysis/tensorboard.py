"""Export captured statistics and tensors as TensorBoard event files.

``python -m runner.tensorboard_export PATH`` (a run or a sweep) writes, for every run, a
``tensorboard/`` directory next to its parquet files; ``tensorboard --logdir PATH`` then shows a
sweep's runs side by side. Per step it holds, under ``train/`` and, for the eval passes of a
training run (``split == "eval"`` in ``steps.parquet``, phase ``eval`` in the captures), ``eval/``:

* scalars ``SPLIT/loss`` (and ``SPLIT/accuracy`` where the run has it) and
  ``SPLIT/HOOK/LABEL/KIND/STAT`` for every statistic row (``STAT`` in ``SCALAR_STATS``);
* histograms ``SPLIT/HOOK/LABEL/KIND`` of every kept tensor (``capture`` entries, ``tensors.parquet``).

``LABEL`` is the layer as ``runner.analysis.per_layer`` names it (``fc.bias``, ``relu #1``); the tags
are ``common.tags``', the ones the live loggers (``logger=tensorboard``, ``runner.live``) write.
Events are written with ``torch.utils.tensorboard`` (the ``tensorboard`` package, offline).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from common.records import EVENTS_DIR
from common.tags import capture_tag
from runner.analysis.load import load_stats, load_steps, load_tensors, run_dirs

#: Statistics written as scalars (``min``/``max`` and the counts are in the histograms or the report).
SCALAR_STATS = ("mean", "std", "abs_mean", "l2", "zero_frac")
#: Step metrics written as ``SPLIT/NAME`` scalars where ``steps.parquet`` has them.
STEP_METRICS = ("loss", "accuracy")


def _tag(row) -> str:
    return capture_tag(row.phase, row.hook, row.layer, row.kind, row.slot, row.call)


def export_run(run_dir: str | Path) -> Path:
    """Write ``run_dir/tensorboard/`` for one run and return it (event files replace earlier exports)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(f"{exc}; install it with: pip install 'hook-runner[tensorboard]'") from None

    run_dir = Path(run_dir)
    out = run_dir / EVENTS_DIR
    for old in out.glob("events.out.tfevents.*"):
        old.unlink()
    stats = load_stats(run_dir)
    tensors = load_tensors(run_dir)
    with SummaryWriter(log_dir=str(out)) as writer:
        steps = load_steps(run_dir)
        for metric in (m for m in STEP_METRICS if m in steps.columns):
            for step, split, value in zip(steps["step"], steps["split"], steps[metric]):
                if not pd.isna(value):
                    writer.add_scalar(f"{split}/{metric}", float(value), int(step))
        for row in stats.itertuples():
            tag = _tag(row)
            for stat in SCALAR_STATS:
                writer.add_scalar(f"{tag}/{stat}", getattr(row, stat), row.step)
        for row in tensors.itertuples():
            writer.add_histogram(_tag(row), row.tensor.astype("float32", copy=False), row.step)
    return out


def export(path: str | Path) -> list[Path]:
    """Export every run at or under ``path``; return the event directories written."""
    return [export_run(run_dir) for run_dir in run_dirs(path)]


def main(argv: list[str] | None = None) -> None:
    """``python -m runner.tensorboard_export PATH``: print each event directory written."""
    parser = argparse.ArgumentParser(prog="python -m runner.tensorboard_export", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a run directory or a sweep directory")
    args = parser.parse_args(argv)
    try:
        written = export(args.path)
    except (FileNotFoundError, ImportError) as exc:
        parser.exit(2, f"error: {exc}\n")
    for out in written:
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
