"""What a run or a sweep recorded and did, in a few lines: the end of ``python -m runner`` and the head of the report.

A run gets one line for itself (steps, last losses) and its entries' answers
(``runner.analysis.answers``: a ``clamp`` entry's clipped fraction, a ``store`` entry's shards, a
patching job's recovered fraction, ...); an entry whose type has no answerer, or whose answerer found
nothing to answer with, names, when it recorded
statistics, the layers with the largest and smallest norm and those that look dead or non-finite
(``answers.statistics.recorded_answer``), else the run-total files it wrote. A sweep of patching,
attribution or steering jobs answers once for all of them (each type's declared sweep answer,
``HookSpec.answers.sweep``: the cells that recover most, the KL per scale); any other sweep gets a
table of the swept values against the last train loss and its headline statistic, in job order (the order of the values on the command
line, as the report's pictures): the fraction clipped when the jobs clipped and it differs between
them, else of the largest norm of each recorded kind the one that differs most between the jobs; a
statistic that is the same in every job is one line under the table, never its column.
Every number is read back from the run's parquet files, the same ones the loaders give.

A run's own line is read with pyarrow alone, and the answers and the loaders (pandas) are imported
when a run has entries to answer or the path is a sweep: a run without hook entries prints its
summary without importing pandas (about a third of a second of CPU).
"""
from __future__ import annotations

import importlib
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq
import yaml

from common.records import GENERATE, MANIFEST, RUN_TOTAL_SCHEMAS, STEPS
from runner.analysis.intact import intact
from common.run_config import saved_config_path

if TYPE_CHECKING:
    import pandas as pd

#: Rows of a sweep's table shown on the terminal (the report shows them all).
MOST_JOBS = 20
#: A sweep table's cell where a job has no value; a line under the table says which jobs and why.
BLANK = "—"


def entry_types(run_dir: Path) -> dict[str, str]:
    """``{entry name: hook type}`` from the run's saved config (empty when it has none); a ``mode=generate``
    run's generation first, as the entry ``generate`` (``answers.generation``). A type of a user's module the
    run imported (the entry's ``_module_``) is known here too, with what it declares, its module imported."""
    path = saved_config_path(run_dir)
    config = (yaml.safe_load(path.read_text()) or {}) if path else {}
    own = {GENERATE: GENERATE} if config.get("mode") == GENERATE else {}
    entries = {name: entry or {} for name, entry in (config.get("hooks") or {}).items()}
    for name, entry in entries.items():
        _import_module_of(name, entry)
    return {**own, **{name: str(entry.get("type", "?")) for name, entry in entries.items()}}


def _import_module_of(name: str, entry: dict) -> None:
    """Import the module registering ``entry``'s type when it names one (``_module_``) and the type is not known
    yet. One that no longer imports leaves the type unknown, said in a warning: the entry is answered by what
    it recorded."""
    from hooks.specs import HOOK_TYPES  # imported for a run with entries only (start-up); no torch
    from runner.config.registry import MODULE_KEY

    module = entry.get(MODULE_KEY)
    if module and entry.get("type") not in HOOK_TYPES:
        try:
            importlib.import_module(str(module))
        except Exception as exc:  # noqa: BLE001 - gone or broken since the run: its entry's records still answer
            warnings.warn(f"hooks.{name}.{MODULE_KEY}: cannot import '{module}' ({type(exc).__name__}: {exc}); "
                          f"type '{entry.get('type')}' is unknown here, so the entry is answered by what it recorded",
                          stacklevel=2)


def summarize_run(run_dir: str | Path, on_corrupt: str = "error") -> list[str]:
    """The lines of one run: the run itself, then each hook entry's answer (``on_corrupt`` as for ``load_stats``)."""
    run_dir = Path(run_dir)
    lines = [f"run {run_dir}: {_steps_line(_steps(run_dir, on_corrupt))}"]
    totals = _run_total_rows(run_dir)
    for name, kind in entry_types(run_dir).items():
        from runner.analysis.answers import answer_of  # pandas: only for a run with entries

        named = name if kind == name else f"{name} ({kind})"
        answer = answer_of(run_dir, name, kind)
        own = answer.lines if answer is not None else [] if totals.get(name) else ["recorded nothing"]
        lines += [f"  {named}: {line}" if i == 0 else f"    {line}" for i, line in enumerate(own + totals.get(name, []))]
    return lines


def _run_total_rows(run_dir: Path) -> dict[str, list[str]]:
    """Per entry, a line per run-total file it wrote rows to (``units.parquet``, ``lens.parquet``, ...), over
    the run's ranks' parts (``rank-N``) when it ran on several."""
    from common.ranks import rank_files  # imported here: the summary's imports are kept few (start-up)

    out: dict[str, list[str]] = {}
    for name in RUN_TOTAL_SCHEMAS:
        counts: dict[str, int] = {}
        for _, file in rank_files(run_dir, name):
            with pq.ParquetFile(file) as written:  # not pq.read_table: its dataset module imports pandas
                for count in written.read(columns=["hook"]).column("hook").value_counts().to_pylist():
                    counts[count["values"]] = counts.get(count["values"], 0) + count["counts"]
        for hook, rows in counts.items():
            out.setdefault(hook, []).append(f"wrote {rows} rows of {name}")
    return out


def _steps(run_dir: Path, on_corrupt: str) -> dict[str, list]:
    """The run's ``steps.parquet`` columns as lists, each rank's part after the other as the loaders read them,
    with each row's ``rank`` (``on_corrupt`` as for ``load_stats``: a damaged run raises or is left out)."""
    runs, _ = intact([run_dir], on_corrupt, STEPS)
    if not runs:
        raise FileNotFoundError(f"no undamaged complete run at or under '{run_dir}'")
    steps: dict[str, list] = {"rank": []}
    for part in runs[str(run_dir)].parts:
        with pq.ParquetFile(part.file) as written:
            table = written.read(columns=[c for c in ("split", "loss", "accuracy") if c in written.schema_arrow.names])
        for name in table.column_names:
            steps.setdefault(name, [None] * len(steps["rank"])).extend(table.column(name).to_pylist())
        for name in steps.keys() - {"rank", *table.column_names}:  # a column another rank's part has
            steps[name].extend([None] * table.num_rows)
        steps["rank"].extend([part.rank] * table.num_rows)
    return steps


def _steps_line(steps: dict[str, list]) -> str:
    split = steps.get("split")
    train = [i for i in range(len(steps["rank"])) if split is None or split[i] == "train"]
    evals = [i for i in range(len(steps["rank"])) if split is not None and split[i] == "eval"]
    ranks = len({steps["rank"][i] for i in train})  # a torchrun run: each rank's steps
    text = f"{len(train) // max(ranks, 1)} step(s){f' on {ranks} ranks' if ranks > 1 else ''}, " \
           f"last loss {_number(last_value(steps, 'loss', train))}"
    if evals:
        text += f", last eval loss {_number(last_value(steps, 'loss', evals))}"
    if any(not _missing(value) for value in steps.get("accuracy", ())):
        text += f", last {'eval' if evals else 'train'} accuracy {_number(last_value(steps, 'accuracy', evals or train))}"
    return text


def sweep_table(path: str | Path, on_corrupt: str = "error") -> pd.DataFrame:
    """One row per job of the sweep at ``path``, in job order (the order of the swept values on the
    command line, ``runner.analysis.order``): the swept overrides, ``loss`` (the last train loss, when
    the jobs had one) and the headline statistic: ``clipped`` (fraction of gradient elements) when the
    jobs clipped and it differs between them, else of ``largest KIND l2`` (per recorded kind, the largest
    of a job's tensors' mean l2) the one whose values differ most (``spread``). The statistics the same
    in every job are ``attrs["same"]`` (``{name: value}``), not columns; ``attrs["swept"]`` names the swept columns
    and ``attrs["runs"]`` the rows' runs. A job without a value (no such kind recorded, no train loss, no such
    override) is NaN there. ``on_corrupt`` as for ``load_stats``."""
    from runner.analysis.answers.statistics import COLUMNS
    from runner.analysis.load import load_stats, load_steps, override_columns, run_dirs

    steps = load_steps(path, columns=["step", "split", "loss"], on_corrupt=on_corrupt)
    stats = load_stats(path, columns=COLUMNS, on_corrupt=on_corrupt)
    stats = stats[stats["phase"] != "eval"]
    firsts = steps.drop_duplicates("run_dir").set_index("run_dir")
    swept = [c for c in override_columns(steps) if firsts[c].astype(str).nunique() > 1]
    runs = [str(run) for run in run_dirs(path, on_corrupt)]
    table = firsts.loc[runs, swept].reset_index(drop=True)
    by_run = steps[steps["split"] == "train"].groupby("run_dir", observed=True)["loss"].last()  # skips NaN
    if by_run.notna().any():  # loss=none: no column of NaN
        table["loss"] = by_run.reindex(runs).to_numpy()
    candidates = _statistics(stats, runs)
    varying = {name: values for name, values in candidates.items() if spread(values) > 0}
    if varying:
        name = "clipped" if "clipped" in varying else max(varying, key=lambda n: spread(varying[n]))
        table[name] = varying[name]
    table.attrs["same"] = {name: float(np.nanmax(values)) for name, values in candidates.items()
                           if name not in varying and not np.isnan(values).all()}
    table.attrs["swept"], table.attrs["runs"] = swept, runs
    return table


def _statistics(stats: pd.DataFrame, runs: list[str]) -> dict[str, np.ndarray]:
    """Each job's candidate headline statistics, by name: ``clipped`` (``answers.statistics.clipped``) when
    any job clipped, and ``largest KIND l2`` (the largest of ``answers.statistics.norms``) per kind of
    ``NORM_KINDS`` recorded; NaN for a job without it."""
    from runner.analysis.answers.statistics import NORM_KINDS, clipped, norms  # imported here, as rank_files above

    by_run = {str(run): rows for run, rows in stats.groupby("run_dir", observed=True)}
    of = [by_run.get(run, stats.iloc[:0]) for run in runs]
    found = {}
    if (stats["kind"] == "clipped").any():
        found["clipped"] = np.array([clipped(rows).fraction for rows in of], dtype=np.float64)
    for kind in (k for k in NORM_KINDS if (stats["kind"] == k).any()):
        found[f"largest {kind} l2"] = np.array([norms(rows, kind).max() for rows in of], dtype=np.float64)
    return found


def spread(values: np.ndarray) -> float:
    """How far apart the jobs' values are, relative to their size: (max - min) / max |value| over the
    values that are not NaN (0 when they are all equal or there are none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    top = float(np.abs(values).max()) if len(values) else 0.0
    return float(values.max() - values.min()) / top if top > 0 else 0.0


def summarize(path: str | Path, on_corrupt: str = "error", corrupted: str | Path | None = None) -> str:
    """The summary of the run or sweep at ``path`` and the command that writes its report
    (``on_corrupt`` as for ``load_stats``; ``corrupted``: a patching sweep's baseline run, for its
    recovered fractions)."""
    path = Path(path)
    if (path / MANIFEST).is_file():  # a run (checked whole as it is read)
        lines = summarize_run(path, on_corrupt)
    else:
        from runner.analysis.answers import sweep_answer_of
        from runner.analysis.load import run_dirs

        runs = run_dirs(path, on_corrupt)
        lines = [f"sweep {path}: {len(runs)} complete job(s)"]
        answer = sweep_answer_of(path, {name: kind for run in runs for name, kind in entry_types(run).items()},
                                 corrupted, on_corrupt)
        lines += ["  " + line for line in (answer.lines if answer is not None else _jobs_lines(path, on_corrupt))]
    lines.append(f"report: python -m runner.report {path}")
    return "\n".join(lines)


def _jobs_lines(path: Path, on_corrupt: str) -> list[str]:
    """``sweep_table`` as text, its first ``MOST_JOBS`` rows, and the statistics the same in every job."""
    from runner.analysis.answers.statistics import percent

    table = sweep_table(path, on_corrupt)
    shown = table.head(MOST_JOBS)
    swept = table.attrs["swept"]
    said = {column: _swept if column in swept else percent if column == "clipped" else _statistic for column in shown}
    lines = shown.to_string(index=False, formatters=said,
                            na_rep=BLANK).splitlines() if len(table.columns) else []  # nothing swept, no loss, no statistic
    lines += _blanks(shown, path, swept)
    if len(table) > MOST_JOBS:
        lines.append(f"... and {len(table) - MOST_JOBS} more job(s): every job is in the report")
    same = table.attrs["same"]
    if same:
        lines.append("the same in every job: " + ", ".join(
            f"{name} {percent(value) if name == 'clipped' else f'{value:.4g}'}" for name, value in same.items()))
    return lines


def _no_value(value) -> bool:
    return value is None or isinstance(value, (float, np.floating)) and math.isnan(value)


def _swept(value) -> str:
    from runner.analysis.numbers import plain

    return plain(value, "g")


def _statistic(value: float) -> str:
    return f"{value:.4g}"


def _blanks(shown: pd.DataFrame, path: Path, swept: list[str]) -> list[str]:
    """A line per column of ``shown`` with a ``BLANK``: which jobs and why they have no value there."""
    lines = []
    for column in shown:
        missing = [i for i, value in enumerate(shown[column]) if _no_value(value)]
        if missing:
            jobs = [_job(path, shown.attrs["runs"][i]) for i in missing]
            why = (f"had no {column} override" if column in swept else "recorded no train loss" if column == "loss"
                   else "clipped nothing" if column == "clipped" else f"recorded no {column.split()[1]}")
            lines.append(f"{BLANK} under {column}: {_listed(jobs)} {why}")
    return lines


def _job(path: Path, run: str) -> str:
    """A run of the sweep at ``path`` as the lines name it: ``job 3``, its directory under ``path``."""
    return f"job {Path(run).relative_to(path).as_posix()}" if Path(run).is_relative_to(path) else run


def _listed(names: list[str]) -> str:
    from runner.analysis.answers.statistics import MOST_NAMES, capped

    return capped(names, 2 * MOST_NAMES)


def last_value(steps: dict[str, list], column: str, rows: list[int]) -> float:
    """The last value of ``column`` in ``rows`` that is neither null nor NaN (NaN when there is none)."""
    values = [steps[column][i] for i in rows if not _missing(steps[column][i])] if column in steps else []
    return float(values[-1]) if values else float("nan")


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def _number(value: float) -> str:
    return "none" if math.isnan(value) else f"{value:.4g}"
