"""``python -m runner.report PATH``: one self-contained HTML page about a run or a sweep, read top-down.

First what a reader wants first: the summary the run printed (``runner.analysis.summary``: each
entry's answer, a patching or steering sweep's answer for all its jobs, another sweep's table of jobs),
right under it the picture of that answer in the same order (a steering run's KL, top-token change and
metric per steered layer and scale; a patching sweep's heatmap and table), and what looks abnormal
(NaN/Inf, gradients that are exactly zero, activations that are zero everywhere, dead units of
non-negative outputs); then the pictures (a sweep's comparison and loss curves, each job's pictures)
and the unit statistics of whole-dataset passes (``units.parquet``: the top examples of a few units
first, as the summary names its top units, their maps and inputs as the run kept them,
``unit_examples.parquet``; then per-layer tables and histograms); first of all,
a sweep that did not complete says so (``sweep.json``); then the details, collapsed:
the jobs and their overrides with a train/eval summary, the failed jobs, the table of every
recorded layer and statistic, each job's resolved config. Pictures are ``runner.plots``' embedded
as PNG data URIs: no file beside the page and nothing fetched when it is opened.

The page stays the same size as a sweep grows: per-job pictures and configs are drawn for the
first jobs only (``MOST_JOB_PICTURES``, ``MOST_CONFIGS``), one line per job in a picture only up to
``MOST_LINES`` jobs, and a sweep of more than ``MOST_TABLE_JOBS`` jobs gets the per-layer table
over all its jobs; a patching sweep's jobs are its heatmap. Jobs are in job order (the order of the
values on the command line).
Any complete run or sweep gives a page, whatever it recorded: a section with nothing for it is left
out, heading and all (unit statistics of a run without a units entry, patching of a run that patched
nothing, failed jobs of a single run, pictures where none could be drawn); within a section, what
its data cannot give is one line saying why. It is written to ``PATH/report.html`` (or ``--out``) and
its path is printed.
"""
from __future__ import annotations

import argparse
import base64
import html
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from common.durable import replaced
from common.registry import imported
from common.records import RUN_TOTAL_SCHEMAS, UNITS
from runner.analysis import plots
from runner.analysis.intact import ON_CORRUPT, CorruptRunError, PendingRunsWarning, SkippedRunsWarning
from runner.analysis.load import (abnormal, config_of, dead_units, failed_jobs, load_stats, load_steps,
                                  load_tensors, overrides_of, run_dirs)
from runner.analysis.sweep_jobs import IncompleteSweepWarning, incomplete, listed_states
from runner.analysis.patching import ATTRIBUTION, CLEAN, LAYER, patching_table
from runner.analysis.answers.methods import measured_metric
from runner.analysis.answers.units import INPUTS_SHOWN, UNITS_SHOWN
from runner.analysis.steering import steering_picture, steering_table
from runner.analysis.summary import summarize
from runner.analysis.unit_plots import RunExamples, layer_histograms, run_examples, top_images_of_run, top_tokens_of_run
from runner.analysis.units import load_units, recorded_layers
from common.ranks import rank_files
from common.sweep_format import OK, RUNNING
from hooks.specs import HOOK_TYPES, Section

REPORT = "report.html"
#: The page's own sections, by HTML id and heading, in order: summary, pictures, details (each only where it
#: has something for the runs). A hook type's own section (``HookSpec.section``: steering's picture, the
#: patching heatmaps, unit statistics) goes after the one it names.
PAGE = {"summary": "Summary", "abnormal": "Abnormalities", "pictures": "Pictures", "jobs": "Jobs and overrides",
        "failed": "Failed jobs", "layers": "Recorded layers and statistics", "config": "Resolved config"}
#: Jobs whose own pictures are drawn (the first, in job order), and whose configs are shown.
MOST_JOB_PICTURES = 8
MOST_CONFIGS = 16
#: Jobs drawn as lines of one picture (a sweep comparison, loss curves): more are not told apart.
MOST_LINES = 24
#: Jobs whose per-layer rows the table keeps apart; a larger sweep's table is over all its jobs.
MOST_TABLE_JOBS = 16
#: Units whose top examples are drawn: the units the answer names per layer (the largest max), of this
#: many layers spread over the recorded ones in the model's order, each with the inputs the answer names.
UNITS_PER_LAYER = UNITS_SHOWN
MOST_UNIT_LAYERS = 4
MOST_TOP_EXAMPLES = INPUTS_SHOWN
#: PNG bytes of all top-example grids together: each layer's best unit is drawn first, then its
#: second; a grid that would pass the budget is left out (photos or noise make large grids).
MOST_TOP_EXAMPLE_BYTES = 600_000
#: Layers whose histograms of unit means and dead fractions are drawn (spread like the units above).
MOST_HISTOGRAM_LAYERS = 16
_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}th,td{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f3f3f3}pre{background:#f7f7f7;padding:.6em;overflow:auto}pre.summary{white-space:pre-wrap}
img{max-width:100%;border:1px solid #ddd;margin:.4em 0}.ok{color:#2a7a2a}.bad{color:#b00020}.note{color:#777}"""


def render(path: str | Path, corrupted: str | Path | None = None, on_corrupt: str = "error") -> str:
    """The report of the run or sweep at ``path`` as an HTML string (``corrupted``: the baseline run
    of a patching sweep, for its recovered fractions).

    ``on_corrupt`` as for ``load_stats``: a damaged run raises ``CorruptRunError`` naming its file,
    or with ``"skip"`` is left out of every section, said once (``SkippedRunsWarning``)."""
    path = Path(path)
    runs = run_dirs(path, on_corrupt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRunsWarning)  # said above: each table skips the same runs
        warnings.simplefilter("ignore", IncompleteSweepWarning)  # said above, and first on the page
        return _page(path, runs, corrupted, on_corrupt)


def _page(path: Path, runs: list[Path], corrupted: str | Path | None, on_corrupt: str) -> str:
    job = job_names(path, runs)
    stats = load_stats(path, on_corrupt=on_corrupt)
    stats.insert(0, "job", stats["run_dir"].astype(str).map(job))
    steps = load_steps(path, on_corrupt=on_corrupt)
    patching = LAYER in steps.columns
    outputs = load_tensors(path, filters=[("kind", "=", "output")], on_corrupt=on_corrupt)
    body = {
        "summary": f'<pre class="summary">{html.escape(summarize(path, on_corrupt, corrupted))}</pre>',
        "abnormal": _abnormal(stats, outputs, job),
        "pictures": _pictures(runs, job, stats, steps, patching),
        "jobs": _details(f"{len(runs)} job(s)", _jobs(runs, job, steps), open_=len(runs) <= MOST_TABLE_JOBS),
        "failed": _failed(path) if runs != [path] else None,  # a single run: complete, or no page
        "layers": _layers(stats, many=len(runs) > MOST_TABLE_JOBS),
        "config": _configs(runs, job),
    }
    declared = type_sections()
    body.update({section.id: imported(section.writer)(path, runs, steps, corrupted, on_corrupt)
                 for section in declared})
    sections = "\n".join(f'<section id="{key}"><h2>{heading}</h2>\n{body[key]}</section>'
                         for key, heading in page_order(declared).items()
                         if body[key] is not None)  # a section with nothing for these runs is left out
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    state = incomplete(path)  # a sweep with jobs that wrote no data says so first
    state = f'<p class="bad">Not complete: {html.escape(state)}.</p>\n' if state else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>hook-runner report: '
            f'{html.escape(path.name)}</title><style>{_CSS}</style></head><body>\n<h1>hook-runner report</h1>\n'
            f"{state}<p><code>{html.escape(str(path.resolve()))}</code>: {len(runs)} run(s), "
            f"{html.escape(recorded(runs, len(stats)))}; made {when}.</p>\n{sections}\n</body></html>\n")


def type_sections() -> list[Section]:
    """The report sections the hook types this process knows declare (``HookSpec.section``), each once."""
    specs = [HOOK_TYPES.schema_of(name) for name in HOOK_TYPES]
    return list({spec.section.id: spec.section for spec in specs if spec is not None and spec.section}.values())


def page_order(declared: list[Section]) -> dict[str, str]:
    """The page's sections in order, by HTML id with their headings: ``PAGE``'s, each of ``declared`` right after
    the one it names (which may be another declared one)."""
    headings = {**PAGE, **{section.id: section.heading for section in declared}}
    order, pending = list(PAGE), list(declared)
    while pending:
        placed = [section for section in pending if section.after in order]
        if not placed:
            raise ValueError(f"report sections {[s.id for s in pending]} follow none of the page's {order}")
        for section in placed:
            order.insert(order.index(section.after) + 1, section.id)
        pending = [section for section in pending if section not in placed]
    return {key: headings[key] for key in order}


#: The page's sections in order, by HTML id and heading, the built-in types' own included (``page_order``).
SECTIONS = page_order(type_sections())


def recorded(runs: list[Path], statistic_rows: int) -> str:
    """What the runs wrote, in rows: their statistic rows (when any) and the rows of each run-total file
    (``units.parquet``, ...), so that a pass that recorded unit statistics does not read as empty."""
    totals = {name: sum(pq.ParquetFile(file).metadata.num_rows for run in runs for _, file in rank_files(run, name))
              for name in RUN_TOTAL_SCHEMAS}
    parts = [f"{rows:,} rows of {name}" for name, rows in totals.items() if rows]
    return ", ".join(([f"{statistic_rows} statistic rows"] if statistic_rows or not parts else []) + parts)


def write_report(path: str | Path, out: str | Path | None = None, corrupted: str | Path | None = None,
                 on_corrupt: str = "error") -> Path:
    """Write the report of ``path`` to ``out`` (default ``PATH/report.html``) and return where
    (``on_corrupt`` as for ``render``)."""
    out = Path(out) if out else Path(path) / REPORT
    page = render(path, corrupted, on_corrupt)
    with replaced(out) as tmp:  # whole or the old one, with the run's permissions
        tmp.write_text(page, encoding="utf-8")
    return out


def job_names(path: Path, runs: list[Path]) -> dict[str, str]:
    """Each run's name on the page: its directory under ``path`` and, in a sweep, the overrides only it has."""
    overrides = {r: [f"{k}={v}" for k, v in overrides_of(r).items()] for r in runs}
    common = set.intersection(*(set(o) for o in overrides.values())) if len(runs) > 1 else set()
    names = {}
    for r in runs:
        where = str(r.relative_to(path)) if r != path else r.name
        own = " ".join(o for o in overrides[r] if o not in common)
        names[str(r)] = f"{where}: {own}" if own else where
    return names


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, float_format=lambda v: f"{v + 0.0:.4g}", na_rep="", border=0)  # never -0


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>\n{body}</details>"


def job_summary(steps: pd.DataFrame, runs: list[Path]) -> pd.DataFrame:
    """Per run, train and eval kept apart: ``train steps``, ``last train loss``, ``last eval loss`` (when any
    run evaluated), ``last train accuracy``/``last eval accuracy`` (when ``steps.parquet`` has ``accuracy``)
    and ``train wall time s``; indexed by ``run_dir``. Runs of ``mode=eval`` (a pass over data) say ``pass``
    for ``train``."""
    split = steps["split"].astype(str) if "split" in steps.columns else pd.Series("train", index=steps.index)
    has_eval, has_accuracy = bool((split == "eval").any()), "accuracy" in steps.columns
    columns = ["loss", "wall_time_s"] + (["accuracy"] if has_accuracy else [])
    groups = steps[columns].assign(run_dir=steps["run_dir"].astype(str), split=split).groupby(["split", "run_dir"])
    last, size, total = groups.last(), groups.size(), groups["wall_time_s"].sum()  # last skips NaN
    names = [str(r) for r in runs]

    def of(frame, which: str, column: str | None = None) -> list:
        part = frame.xs(which, level="split") if which in frame.index.get_level_values("split") else frame.iloc[:0]
        values = (part if column is None else part[column]).reindex(names)
        return list(values.fillna(0) if column is None else values)

    table = {"run_dir": names, "train steps": [int(n) for n in of(size, "train")],
             "last train loss": of(last, "train", "loss")}
    if has_eval:
        table["last eval loss"] = of(last, "eval", "loss")
    if has_accuracy:
        table["last train accuracy"] = of(last, "train", "accuracy")
        if has_eval:
            table["last eval accuracy"] = of(last, "eval", "accuracy")
    table["train wall time s"] = of(total, "train")
    table = pd.DataFrame(table).set_index("run_dir")
    if all(_mode(r) == "eval" for r in runs):  # its steps are a pass over data, not training
        table = table.rename(columns=lambda name: name.replace("train ", "pass "))
    return table


def _mode(run: Path) -> str | None:
    """The run's ``mode`` (``train``, ``eval``) from its config; ``None`` for a run not made by the CLI."""
    text = config_of(run)
    return (yaml.safe_load(text) or {}).get("mode") if text else None


def _jobs(runs, job: dict[str, str], steps: pd.DataFrame) -> str:
    overrides = {r: [f"{k}={v}" for k, v in overrides_of(r).items()] for r in runs}
    common = [o for o in overrides[runs[0]] if all(o in own for own in overrides.values())] if len(runs) > 1 else []
    summary = job_summary(steps, runs)
    table = pd.DataFrame({"job": [job[str(r)].partition(": ")[0] for r in runs],  # the overrides follow
                          "overrides": [" ".join(o for o in overrides[r] if o not in common) or "(none)" for r in runs]})
    table = pd.concat([table, summary.reset_index(drop=True)], axis=1)
    shared = f"<p>Common to every job: <code>{html.escape(' '.join(common))}</code></p>\n" if common else ""
    return shared + _table(table)


def _failed(path: Path) -> str:
    failed = failed_jobs(path)
    if failed.empty:
        return '<p class="ok">No job failed.</p>'
    shown = failed.assign(job_dir=[str(Path(j).relative_to(path)) for j in failed["job_dir"]])
    states = {job["state"] for job in listed_states(path) or () if job["state"] not in (OK, RUNNING)}
    what = "failed" if states <= {"failed"} else "did not complete (failed, interrupted, not started)"
    return f'<p class="bad">{len(failed)} job(s) {what} and wrote no data.</p>\n' + _table(shown)


def _configs(runs, job: dict[str, str]) -> str:
    parts = []
    for r in runs[:MOST_CONFIGS]:
        text = config_of(r)
        shown = (f"<pre>{html.escape(text)}</pre>" if text is not None else
                 '<p class="note">not recorded: the run was not made by <code>python -m runner</code> '
                 "(no <code>config.yaml</code> or <code>.hydra/config.yaml</code>)</p>")
        parts.append(_details(job[str(r)], shown))
    if len(runs) > MOST_CONFIGS:
        parts.append(_note(f"The configs of the first {MOST_CONFIGS} jobs; the other {len(runs) - MOST_CONFIGS} "
                           f"differ from them only in their overrides (Jobs and overrides), each in its config.yaml."))
    return "\n".join(parts)


def _layers(stats: pd.DataFrame, many: bool) -> str | None:
    if stats.empty:
        return None
    keys = ["hook", "layer", "phase", "kind", "slot"] if many else ["job", "hook", "layer", "phase", "kind", "slot"]
    table = stats.groupby(keys, sort=False, observed=True).agg(
        captures=("step", "size"), steps=("step", "nunique"),
        shape=("tensor_shape", lambda s: "x".join(str(int(d)) for d in s.iloc[0])),
        mean=("mean", "mean"), std=("std", "mean"), min=("min", "min"), max=("max", "max"),
        l2=("l2", "mean"), zero_frac=("zero_frac", "mean"), nan=("nan_count", "sum"), inf=("inf_count", "sum"),
    ).reset_index()
    if not many and table["job"].nunique() == 1:
        table = table.drop(columns="job")
    over = f"over the {stats['job'].nunique()} jobs, " if many else ""
    return _details(f"{len(table)} rows: one per {'job, ' if 'job' in table else ''}hook, layer, phase, kind and slot",
                    "<p>Phase <code>eval</code>: the eval passes of a training run; mean, std, l2 and zero_frac are "
                    f"averaged {over}over calls and steps, min and max taken over them.</p>\n" + _table(table))


def _abnormal(stats: pd.DataFrame, outputs: pd.DataFrame, job: dict[str, str]) -> str | None:
    if stats.empty and outputs.empty:  # no statistic recorded (a run of run-total files only): no columns to check
        return None
    found = abnormal(stats)
    units = dead_units(outputs)
    dead = units[units["dead"] > 0]
    checked = ("Checked: NaN and Inf counts of every capture; gradients that are exactly 0 in every capture; "
               "activations that are 0 everywhere" + (
                   f"; dead units (channels or features that are 0 for every sample) among the {len(units)} kept "
                   "non-negative outputs." if len(units) else "."))
    if found.empty and dead.empty:
        return f'<p class="ok">Nothing abnormal found.</p><p class="note">{checked}</p>'
    parts = [f'<p class="bad">{len(found)} finding(s), {len(dead)} layer(s) with dead units.</p>']
    if not found.empty:
        parts.append(_table(found.assign(run_dir=found["run_dir"].astype(str).map(job))
                            .rename(columns={"run_dir": "job"})))
    if not dead.empty:
        parts.append("<h3>Dead units</h3>" + _table(dead.assign(run_dir=dead["run_dir"].astype(str).map(job))
                                                    .rename(columns={"run_dir": "job"})))
    return "\n".join(parts) + f'<p class="note">{checked}</p>'


def units_section(path: Path, runs: list[Path], steps: pd.DataFrame, corrupted: str | Path | None,
                  on_corrupt: str) -> str | None:
    """The ``units`` section (``UnitsSpec.section``): the ``units`` entries' tables (``load_units``: a
    sweep's jobs and a run's ranks merged), per layer: its units, the values each unit saw, the mean of
    the unit means, the units never above the threshold (dead); then the histograms of unit means and dead fractions of up to
    ``MOST_HISTOGRAM_LAYERS`` layers; the top examples of a few units (``_top_examples``) first, as the
    summary names its top units first."""
    try:
        units = load_units(path, on_corrupt)
    except FileNotFoundError:
        return None
    if units.empty:
        return _note(f"The units entries wrote no row to {UNITS}: no layer they name saw a value.")
    table = units.assign(dead=units.above == 0).groupby(["hook", "layer", "call"], sort=False).agg(
        units=("unit", "size"), values=("count", "first"), mean_of_means=("mean", "mean"),
        mean_fraction_above=("fraction_above", "mean"), never_above=("dead", "sum")).reset_index()
    order = recorded_layers(next(r for r in runs if rank_files(r, UNITS)))
    drawn = spread_layers(units, order, MOST_HISTOGRAM_LAYERS)
    layers = units.layer.nunique()
    capped = (_note(f"Histograms of {len(drawn)} of the {layers} layers, evenly spread in the model's order; "
                    f"every layer: runner.analysis.unit_plots.layer_histograms(load_units(PATH)).")
              if len(drawn) < layers else "")
    return ("<h3>Top examples</h3>\n" + _top_examples(path, units, order, on_corrupt)  # as the summary: top units first
            + "<h3>Per layer</h3>\n<p><code>values</code> each unit saw (samples x positions), <code>never_above</code> "
            "the units never above their entry's threshold (dead). Every unit's numbers and top samples: "
            f"<code>load_units({html.escape(repr(str(path)))})</code>.</p>\n" + _table(table)
            + _img(layer_histograms(pd.concat([units[units.layer == layer] for layer in drawn])),
                   "unit means and dead fractions per layer") + capped)


def spread_layers(units: pd.DataFrame, order: list[str], most: int) -> list[str]:
    """Up to ``most`` of the recorded layers, evenly spread over them in ``order`` (the model's call
    order as the run recorded it: ``recorded_layers``; layers not in it come after), the first and the last among them; in that order."""
    position = {name: i for i, name in enumerate(order)}
    layers = sorted(dict.fromkeys(units.layer), key=lambda name: position.get(name, len(position)))
    spread = np.linspace(0, len(layers) - 1, min(most, len(layers))).round().astype(int)
    return [layers[i] for i in dict.fromkeys(spread)]


def chosen_units(units: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The rows of the units whose top examples the report draws, layer by layer: the ``UNITS_PER_LAYER``
    with the largest max (first call; ties: the lower unit, as ``top_units`` and the answer) of
    ``MOST_UNIT_LAYERS`` layers (``spread_layers`` in ``order``), ``rank`` 0 for each layer's largest."""
    return pd.concat([units[(units.layer == layer) & (units.call == 0)]
                      .sort_values(["max", "unit"], ascending=[False, True]).head(UNITS_PER_LAYER)
                      .assign(rank=lambda rows: range(len(rows)))
                      for layer in spread_layers(units, order, MOST_UNIT_LAYERS)], ignore_index=True)


def _top_examples(path: Path, units: pd.DataFrame, order: list[str], on_corrupt: str) -> str:
    """The top examples of ``chosen_units`` as the run kept them (``run_examples``: maps and inputs from
    its files): an image grid with the unit's map overlaid, or token ids in context; or one line why not."""
    try:
        run = run_examples(path)
    except FileNotFoundError:
        return _note("Not drawn: the run kept no top examples (its units entry had examples: 0, or it was "
                     "written before unit_examples.parquet); run it again to draw them.")
    draw = _drawer(run)
    if draw is None:
        shapes = sorted({str(list(x.shape)) for x in run.inputs.values()}) or ["none kept"]
        return _note(f"Not drawn: the run's inputs ({', '.join(shapes)}) are neither images [C, H, W] of 1 or 3 "
                     f"channels nor token ids.")
    chosen = chosen_units(units, order)
    pngs, budget, failed = {}, MOST_TOP_EXAMPLE_BYTES, {}
    for i in chosen.sort_values("rank", kind="stable").index:  # every layer's best unit before any second
        try:
            png = plots.png_bytes(draw(run, units, chosen.layer[i], int(chosen.unit[i]), MOST_TOP_EXAMPLES))
        except ValueError as exc:  # a unit whose examples or inputs the run did not keep
            failed[i] = str(exc)
            continue
        if len(png) <= budget:
            pngs[i], budget = png, budget - len(png)
    name = {i: f"{chosen.layer[i]} unit {chosen.unit[i]}" for i in chosen.index}
    left = [name[i] for i in chosen.index if i not in pngs and i not in failed]
    layers, recorded = chosen.layer.nunique(), units.layer.nunique()
    which = "each layer" if layers == recorded else (f"each of {layers} of the {recorded} layers, evenly spread "
                                                     "in the model's order (the first and the last among them)")
    ids = " (token ids as numbers: the run keeps no tokenizer)" if draw is top_tokens_of_run else ""
    over = (f" Left out to keep the page small ({MOST_TOP_EXAMPLE_BYTES // 1000} kB of these pictures at most): "
            f"{', '.join(left)}." if left else "")
    not_drawn = "".join(f" Not drawn: {name[i]}: {why}." for i, why in failed.items())
    drawn = [i for i in chosen.index if i in pngs]
    return (f"<p>Drawn: {html.escape(', '.join(name[i] for i in drawn))}: the {UNITS_PER_LAYER} units with the "
            f"largest max of {which}, each with up to its first {MOST_TOP_EXAMPLES} top samples as the run kept "
            f"them (its maps and inputs at the step it saw each){ids}.{html.escape(over + not_drawn)} "
            f"Any unit: <code>runner.analysis.unit_plots.{draw.__name__}</code>.</p>\n"
            + "\n".join(_png(pngs[i], f"top samples of {name[i]}") for i in drawn))


def _drawer(run: RunExamples):
    """``top_tokens_of_run`` for token ids, ``top_images_of_run`` for images (1 or 3 channels), else ``None``."""
    kept = next(iter(run.inputs.values()), None)
    if kept is None:
        return None
    if kept.dtype.kind in "iu":
        return top_tokens_of_run
    return top_images_of_run if kept.ndim == 3 and kept.shape[0] in (1, 3) else None


def _img(fig, alt: str) -> str:
    return _png(plots.png_bytes(fig), alt)


def _png(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _sweep_pictures(stats: pd.DataFrame, steps: pd.DataFrame, jobs: int) -> list[str]:
    if jobs > MOST_LINES:
        return [_note(f"Sweep comparison and loss curves left out: {jobs} jobs are more lines than a picture tells "
                      f"apart ({MOST_LINES}); the summary's table and the loaders compare them.")]
    parts = []
    kinds = [k for k in ("param_grad", "grad_output", "output") if (stats["kind"] == k).any()]
    if kinds:
        parts.append(f"<h3>Sweep: {kinds[0]} l2 per layer</h3>"
                     + _img(plots.compare_runs(stats, stat="l2", kind=kinds[0]), f"{kinds[0]} l2 per run"))
    else:
        parts.append(_note("Sweep comparison left out: no job recorded activation or gradient statistics."))
    if steps["step"].nunique() > 1 and steps["loss"].notna().any():
        parts.append("<h3>Loss per step</h3>" + _img(plots.loss_curves(steps), "loss per step per run"))
    return parts


def _pictures(runs, job: dict[str, str], stats: pd.DataFrame, steps: pd.DataFrame, patching: bool) -> str | None:
    """A sweep's comparison and loss curves, then each of the first jobs' pictures (with what each
    could not draw; what none of them could, said once after them); ``None`` when nothing is drawn
    (each job of a patching sweep is a cell of its heatmap)."""
    if patching and len(runs) > 1:
        return None
    parts = _sweep_pictures(stats, steps, len(runs)) if len(runs) > 1 else []
    shown = {r: plots.run_figures(r, plots.PLOTS) for r in runs[:MOST_JOB_PICTURES]}
    if not any("<img" in part for part in parts) and not any(figures for figures, _ in shown.values()):
        return None
    common = set.intersection(*(set(notes) for _, notes in shown.values())) if len(shown) > 1 else set()
    for r, (figures, notes) in shown.items():
        parts.append(f"<h3>{html.escape(job[str(r)])}</h3>")
        parts += [_img(fig, name) for name, fig in figures]
        parts += [_note(f"not drawn: {n}") for n in notes if n not in common]
    parts += [_note(f"not drawn for any of these jobs: {n}") for n in sorted(common)]
    if len(runs) > MOST_JOB_PICTURES:
        parts.append(_note(f"Pictures of the first {MOST_JOB_PICTURES} jobs; the other "
                           f"{len(runs) - MOST_JOB_PICTURES}: runner.plots.run_figures(RUN_DIR, ...) or plots=[...]."))
    return "\n".join(parts)


def patching_section(path: Path, runs: list[Path], steps: pd.DataFrame, corrupted: str | Path | None,
                     on_corrupt: str) -> str | None:
    """The ``patching`` section (``PatchSpec.section``, ``AttributionSpec``'s): the heatmaps and table of a
    patching sweep or an attribution run (``runner.analysis.patching``; where both are under ``path``, the
    estimate against real patching too), or one line why not; ``None`` for runs that neither patched nor
    attributed."""
    attributed = not load_tensors(path, columns=["kind"], filters=[("kind", "=", ATTRIBUTION)],
                                  on_corrupt=on_corrupt).empty
    if LAYER not in steps.columns and not attributed:
        return None
    stored = None
    if LAYER in steps.columns:
        sources = steps["hooks.patch.source"].dropna().astype(str).unique() if "hooks.patch.source" in steps else []
        if len(sources) != 1:
            return _note(f"Left out: the jobs name {len(sources)} patch sources (hooks.patch.source); "
                         f"one clean run needed.")
        if sources[0] != CLEAN:  # patched from a stored clean run: the corrupted run is needed too
            if corrupted is None:
                return _note("Left out: the recovered fraction needs the corrupted run: --corrupted RUN_DIR.")
            stored = (sources[0], corrupted)
    try:
        table = patching_table(path, *(stored or (None, None)), measured_metric(steps) or "logit", on_corrupt)
    except (FileNotFoundError, ValueError) as exc:
        return _note(f"Left out: {exc}")
    return (_img(plots.patching_heatmap(table), "recovered fraction per layer and index")
            + _note("Colour: the recovered fraction, (patched - corrupted) / (clean - corrupted): red towards the "
                    "clean metric (1: all of the gap), blue away from it, white where the patch changed nothing.")
            + _table(table.dropna(axis=1, how="all")))  # a patching sweep's receiver, scale, kl: no row has one


def steering_section(path: Path, runs: list[Path], steps: pd.DataFrame, corrupted: str | Path | None,
                     on_corrupt: str) -> str | None:
    """The ``steering`` section (``SteerSpec.section``): a steering run's or sweep's picture and table
    (``steering_table``: per steered layer and scale the KL, how often the top token changed and the
    metric, as the summary says them); ``None`` for runs that steered nothing."""
    metric = measured_metric(steps) or "logit_diff"
    try:
        table = steering_table(path, metric, steps, on_corrupt)
    except ValueError:  # no steer.parquet
        return None
    shown = table[[c for c in ("layers", "scale", "kl", "top_changed", "steered", "unsteered") if c in table]]
    return (_img(steering_picture(table), "KL, top-token change and metric per steered layer and scale")
            + _note("kl: the mean KL(unsteered || steered) of the next-token distribution, in nats; top_changed: the "
                    "fraction of samples and steps whose top next token the vector changed"
                    + (f"; steered, unsteered: {metric}, the mean over the steps." if "steered" in table else "."))
            + _table(shown))


def main(argv: list[str] | None = None) -> None:
    """``python -m runner.report PATH [--out FILE] [--on-corrupt skip]``: write the page and print its path.

    What the loaders warn of (jobs still writing, damaged runs skipped, a sweep's jobs that wrote no data) is one
    ``warning: ...`` line each; no run at ``PATH`` (or no ``PATH``) is one ``error: ...`` line, status 2."""
    parser = argparse.ArgumentParser(prog="python -m runner.report", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a run directory or a sweep directory")
    parser.add_argument("--out", help=f"where to write the page (default PATH/{REPORT})")
    parser.add_argument("--corrupted", help="a patching sweep's corrupted (unpatched) run, for the recovered fraction")
    parser.add_argument("--on-corrupt", choices=ON_CORRUPT, default="error",
                        help="a damaged run (truncated file, corrupt manifest): stop naming it (error), or leave it out (skip)")
    args = parser.parse_args(argv)
    out, failed = None, None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", PendingRunsWarning)
        warnings.simplefilter("always", SkippedRunsWarning)
        warnings.simplefilter("always", IncompleteSweepWarning)
        try:
            out = write_report(args.path, args.out, args.corrupted, args.on_corrupt)
        except (FileNotFoundError, CorruptRunError) as exc:  # no run, or a damaged one: one line
            failed = exc
    for warning in said:  # the message alone: its source line names the runner's internals, not the runs
        print(f"warning: {warning.message}", file=sys.stderr)
    if failed is not None:
        parser.exit(2, f"error: {failed}\n")
    print(out)


if __name__ == "__main__":
    main()
