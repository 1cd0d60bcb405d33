"""The answer of a ``mode=generate`` run: the text generated from each prompt; of a sweep of such runs, each
prompt's text under every job's swept values (a steering scale, a layer) side by side.

Read from ``generations.parquet`` (``common.records.GENERATIONS_SCHEMA``); the run's generation answers as
the pseudo-entry ``generate`` (``runner.analysis.summary.entry_types`` adds it to a generation run's entries).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.records import GENERATIONS
from runner.analysis.answers import Answer
from runner.analysis.load import load_table, override_columns
from runner.analysis.numbers import plain

#: Characters of a prompt or a generated text shown on a line (the table keeps them whole).
WIDTH = 60


def generation_answer(run_dir: Path, entry: str) -> Answer | None:
    """One run: a line per prompt, ``'prompt' → 'generated text'``; ``None`` when it generated nothing."""
    if not (run_dir / GENERATIONS).is_file():
        return None
    rows = load_table(run_dir, GENERATIONS).sort_values(["step", "sample"], ignore_index=True)
    if rows.empty:
        return None
    new = [len(ids) for ids in rows["generated_ids"]]  # not Series.map: a categorical maps to a categorical
    counts = f"{min(new)}" if min(new) == max(new) else f"{min(new)} to {max(new)}"
    lines = [f"generated from {len(rows)} prompt(s), {counts} new token(s) each"]
    lines += [f"{_short(prompt)} → {shown}" for prompt, shown in zip(rows["prompt"], _shown(rows))]
    return Answer(lines, rows[["step", "sample", "prompt", "generated_text", "generated_ids"]])


def generation_sweep_answer(path: Path, entry: str, corrupted=None, on_corrupt: str = "error") -> Answer | None:
    """A sweep: per prompt, the text each job generated, labelled by the job's swept values, in job order.
    The table has a row per prompt and a column per job (its label): the texts side by side."""
    rows = load_table(path, GENERATIONS, on_corrupt=on_corrupt)
    if rows.empty:
        return None
    swept = [c for c in override_columns(rows) if rows[c].astype(str).nunique() > 1]
    runs = list(dict.fromkeys(rows["run_dir"].astype(str)))  # job order, as the loader read them
    labels = {str(first["run_dir"]): " ".join(f"{c}={plain(first[c])}" for c in swept) or str(first["run_dir"])
              for _, first in rows.drop_duplicates("run_dir").iterrows()}
    jobs = [labels[run] for run in runs]
    rows = rows.assign(job=pd.Categorical(rows["run_dir"].astype(str).map(labels), jobs, ordered=True),
                       shown=_shown(rows)).sort_values(["sample", "job", "step"], ignore_index=True)
    lines = [f"generated text of {len(runs)} job(s){' by ' + ', '.join(swept) if swept else ''}, per prompt"]
    for (_, prompt), group in rows.groupby(["sample", "prompt"], sort=False, observed=True):
        lines.append(f"{_short(prompt)}:")
        lines += [f"  {job}: {shown}" for job, shown in zip(group["job"], group["shown"])]
    table = rows.pivot_table(index=["sample", "prompt"], columns="job", values="generated_text", aggfunc="first",
                             observed=True)[jobs]
    return Answer(lines, table.reset_index())


def _shown(rows: pd.DataFrame) -> list[str]:
    """Each row's generated text, quoted and cut; its token ids where they decode to no text (ids the
    tokenizer does not have, or only special tokens)."""
    return [_short(text) if text.strip() or not len(ids) else f"(no text: ids {list(ids)})"
            for text, ids in zip(rows["generated_text"], rows["generated_ids"])]


def _short(text: str) -> str:
    """``text`` quoted, cut to ``WIDTH`` characters."""
    return repr(text if len(text) <= WIDTH else text[:WIDTH - 1] + "…")
