"""Each method's answer (``runner.analysis.answers``) as the README's command prints it, against the
table computed by hand from the parquet (and the store's shard files) it was read from.

The README's commands run in-process from a temporary working directory (the config check and plan
of the CLI); a sweep's jobs run as Hydra's basic launcher runs them, into numbered directories, over
fewer values where the README's sweep is long (named at each test). What is printed is
``summarize``'s text, which the CLI prints (``tests/test_summary.py``)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file

from conftest import cli, make_config, run
from runner.analysis.answers import answer_of
from runner.analysis.summary import summarize
from runner.cli.early import expand
from docs_text import blocks, everything, section

ROOT = Path(__file__).resolve().parents[1]
README = everything()  # README.md and the docs pages


def commands(name: str, heading: str, containing: str) -> list[list[str]]:
    """The ``python -m runner`` commands of the bash blocks under ``heading`` of docs page ``name`` whose block
    holds ``containing``."""
    block = next(b for b in blocks(section(name, heading), "bash") if containing in b)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def run_readme(words: list[str], values: dict[str, str] | None = None) -> Path:
    """A README command in-process; a sweep's jobs into SWEEP/N with the swept keys of ``values`` given fewer values."""
    assert words[:3] == ["python", "-m", "runner"], words
    overrides = [w for w in words[3:] if w != "-m"]
    where = next(w.split("=", 1)[1] for w in overrides if w.startswith(("hydra.run.dir=", "hydra.sweep.dir=")))
    kept = [w for w in overrides if not w.startswith("hydra.")]
    if words[3] != "-m":
        run(make_config(*kept), Path(where), kept)
        return Path(where)
    kept = [f"{w.split('=', 1)[0]}={values[w.split('=', 1)[0]]}" if w.split("=", 1)[0] in (values or {}) else w
            for w in kept]
    for num, job in enumerate(expand(kept)):
        run(make_config(*job), Path(where) / str(num), job)
    return Path(where)


def steps_of(run_dir: Path) -> pd.DataFrame:
    steps = pq.read_table(run_dir / "steps.parquet").to_pandas()
    return steps[steps["split"] == "train"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_clip_and_stats_answers_are_the_parquet_s(in_tmp, capsys):
    """README's first run (``model=convnet 'hooks=[clip,stats]'``): the clip line from the ``clipped`` rows,
    the stats line from the largest and smallest mean ``grad_output`` l2."""
    readme = README.split("$ python -m runner model=convnet 'hooks=[clip,stats]'", 1)[0]  # the command above its output
    words = shlex.split("model=convnet 'hooks=[clip,stats]'")
    assert "python -m runner model=convnet 'hooks=[clip,stats]'" in README and readme
    cli(words, in_tmp / "run")
    printed = capsys.readouterr().out
    stats = pq.read_table(in_tmp / "run" / "stats.parquet").to_pandas()
    clipped = stats[(stats.hook == "clip") & (stats.kind == "clipped")]
    elements = np.rint(clipped.numel * (1 - clipped.zero_frac)).astype(int)
    line = (f"  clip (clamp): clipped {(elements > 0).sum()} of {len(clipped)} gradients, {elements.sum():,} of "
            f"{clipped.numel.sum():,} elements ({100 * elements.sum() / clipped.numel.sum():.1f}%)")
    assert line in printed.splitlines()
    answer = answer_of(in_tmp / "run", "clip", "clamp")
    groups = clipped.assign(group=clipped.layer.str.split(".").str[0], elements=elements).groupby("group")
    by_hand = (groups.elements.sum() / groups.numel.sum()).to_dict()
    assert dict(zip(answer.table.group, answer.table.clipped)) == pytest.approx(by_hand, rel=1e-12)
    grads = stats[(stats.hook == "stats") & (stats.kind == "grad_output")].groupby("layer").l2.mean()
    line = next(line for line in printed.splitlines() if line.startswith("  stats: gradient l2"))
    assert line == (f"  stats: gradient l2 (grad_output, {len(grads)} tensors): largest {grads.idxmax()} "
                    f"{grads.max():.3g}, smallest {grads.idxmin()} {grads.min():.3g}")


def test_the_store_answer_counts_the_shard_files(in_tmp):
    """README's store pass over 192 crops in float16 shards of 64: 3 shards, 192 samples, their bytes, where."""
    make = commands("tutorials/units.md", "Unit statistics and top examples", "python assets/make_crops.py")[0]
    subprocess.run([sys.executable, str(ROOT / make[1]), *make[2:]], check=True)
    (store,) = commands("tutorials/units.md", "A store feeding a linear probe", "hooks=store")
    run_dir = run_readme(store)
    text = summarize(run_dir).splitlines()
    where = next(w.split("=", 1)[1] for w in store if w.startswith("hooks.store.path="))
    shards = sorted((Path(where) / "layer3").glob("shard-*.safetensors"))
    rows = [load_file(shard) for shard in shards]
    samples = np.concatenate([r["samples"] for r in rows])
    size = sum(shard.stat().st_size for shard in shards)
    assert len(shards) == 3 and list(samples) == list(range(192)) and {r["activations"].dtype for r in rows} == {np.dtype("float16")}
    assert text[1] == f"  store: wrote {len(shards)} shard(s), {size / 1e6:.3g} MB under {where}"
    assert text[2] == (f"    layer3: {len(shards)} shard(s), 192 samples (ids 0..191), {size / 1e6:.3g} MB of float16 "
                       f"in {where}/layer3")


def patching_by_hand(sweep: Path) -> pd.DataFrame:
    """Per job, from its steps.parquet and its overrides: layer, index, and the mean metric patched, clean, corrupted."""
    rows = []
    for job in sorted(sweep.iterdir(), key=lambda p: int(p.name)):
        steps = steps_of(job)
        overrides = dict(o.split("=", 1) for o in make_config_overrides(job))
        rows.append({"layer": overrides["hooks.patch.layers"], "index": int(overrides["hooks.patch.index"]),
                     "patched": steps.logit_diff.mean(), "clean": steps.clean_logit_diff.mean(),
                     "corrupted": steps.corrupted_logit_diff.mean()})
    table = pd.DataFrame(rows)
    return table.assign(recovered=(table.patched - table.corrupted) / (table.clean - table.corrupted))


def make_config_overrides(job: Path) -> list[str]:
    return json.loads((job / "manifest.json").read_text())["overrides"]


def test_the_patching_answer_names_the_cells_that_recover_most(in_tmp):
    """README's patching sweep with each job's own clean pass, blocks 2 and 3 at positions 14 and 15 (the README
    sweeps 4 blocks x 16 positions: 4 minutes)."""
    (sweep,) = commands("tutorials/patching.md", "Activation patching", "hooks.patch.source=clean")[:1]
    path = run_readme(sweep, {"hooks.patch.layers": "transformer.h.2,transformer.h.3",
                              "hooks.patch.index": "range(14,16)"})
    text = summarize(path).splitlines()
    cells = patching_by_hand(path)
    top = cells.sort_values("recovered", ascending=False, kind="stable").head(5)
    assert text[1] == (f"  activation patching of logit_diff: clean {cells.clean.mean():.4g}, "
                       f"corrupted {cells.corrupted.mean():.4g}")
    assert text[2] == "  recovers most, of 4 cells: " + ", ".join(
        f"{row.layer} [{row.index}] {round(row.recovered, 2) + 0.0:.2f}" for row in top.itertuples())
    assert "transformer.h.3 [15] 1.00" in text[2]  # as the README says: the last block at the last position
    assert len(text) == 4  # no table of 4 lines "transformer.h.2  14"
    from runner.analysis.report import render

    page = render(path)
    first = page.split('<section id="abnormal">', 1)[0]
    assert text[2].strip() in first
    assert page.index('<section id="summary">') < page.index('<section id="patching">') < page.index(
        '<section id="abnormal">')  # the heatmap of the answer right under it, its colours said
    table = page.split('<section id="patching">', 1)[1].split("</section>", 1)[0]
    assert "red towards the clean metric (1: all of the gap), blue away from it" in table
    assert "<th>receiver</th>" not in table and "<th>kl</th>" not in table and "<th>recovered</th>" in table
    assert "lens.parquet" not in page and "among the 0 kept" not in page


@pytest.mark.parametrize("index", ["15", None])
def test_one_patching_run_prints_its_cell_s_recovered_fraction_from_its_steps(in_tmp, capsys, index):
    """One job of README's patching sweep (each job's own clean pass) run alone, ``hooks=patch``: the printed
    answer is its steps' means, its layer from the override, its index from the override or from none (all)."""
    (sweep,) = commands("tutorials/patching.md", "Activation patching", "hooks.patch.source=clean")[:1]
    words = [w for w in sweep[3:] if w != "-m" and not w.startswith(("hydra.", "hooks.patch.layers=",
                                                                       "'hooks.patch.index", "hooks.patch.index"))]
    words += ["hooks.patch.layers=transformer.h.3"] + ([f"hooks.patch.index={index}"] if index else [])
    cli(words, in_tmp / "run")
    printed = capsys.readouterr().out.splitlines()
    steps = steps_of(in_tmp / "run")
    patched, clean, corrupted = steps.logit_diff.mean(), steps.clean_logit_diff.mean(), steps.corrupted_logit_diff.mean()
    recovered = (patched - corrupted) / (clean - corrupted)
    line = (f"  patch: logit_diff patched at transformer.h.3 [{index or 'all'}] {patched:.4g}; clean {clean:.4g}, "
            f"corrupted {corrupted:.4g}: recovered {round(recovered, 2) + 0.0:.2f}")
    assert line in printed
    assert recovered == pytest.approx(1.0)  # the last block at the last position (or at all): the clean output
    table = answer_of(in_tmp / "run", "patch", "patch").table
    assert table[["patched", "clean", "corrupted", "recovered"]].iloc[0].tolist() == pytest.approx(
        [patched, clean, corrupted, recovered], rel=1e-12)


def test_the_attribution_answer_is_the_kept_estimates(in_tmp):
    """README's attribution run: the cells the estimate says recover most, from the kept ``attribution`` tensors."""
    (attribution, _) = commands("tutorials/patching.md", "Attribution and path patching", "hooks=attribution")
    run_dir = run_readme(attribution)
    text = summarize(run_dir).splitlines()
    steps = steps_of(run_dir)
    clean, corrupted = steps.clean_logit_diff.mean(), steps.corrupted_logit_diff.mean()
    kept = pq.read_table(run_dir / "tensors.parquet").to_pandas()
    kept = kept[kept.kind == "attribution"]
    cells = []
    for layer, rows in kept.groupby("layer"):
        per_step = [np.sum([np.asarray(v, np.float32).reshape(s) for v, s in zip(r.tensor_values, r.tensor_shape)], 0)
                    for _, r in rows.groupby("step")]
        cells += [(layer, i, (corrupted + float(e) - corrupted) / (clean - corrupted))
                  for i, e in enumerate(np.mean(per_step, axis=0))]
    top = pd.DataFrame(cells, columns=["layer", "index", "recovered"]).sort_values(
        "recovered", ascending=False, kind="stable").head(5)
    assert text[1] == f"  attribution: attribution estimate of logit_diff: clean {clean:.4g}, corrupted {corrupted:.4g}"
    assert text[2] == f"    recovers most, of {len(cells)} cells: " + ", ".join(
        f"{row.layer} [{row.index}] {round(row.recovered, 2) + 0.0:.2f}" for row in top.itertuples())


def test_the_steering_answer_is_the_kl_and_top_token_change_per_scale(in_tmp):
    """README's steering sweep, blocks 0 and 1 at scales 0 and 32 (the README's: 0, 16 and 32); its report shows,
    right under the summary, a picture of the same numbers in the same order, every colour in its legend."""
    plus, minus, sweep = commands("tutorials/steering.md", "Steering", "hooks.steer.positive")
    for words in (plus, minus):
        run_readme(words)
    path = run_readme(sweep, {"hooks.steer.layers": "transformer.h.0,transformer.h.1", "hooks.steer.scale": "0,32"})
    text = summarize(path).splitlines()
    cells, by_hand = [], []
    for job in sorted(path.iterdir(), key=lambda p: int(p.name)):  # layers x scales: the answer's order
        rows = pq.read_table(job / "steer.parquet").to_pandas()
        changed = np.mean([s[0] != u[0] for s, u in zip(rows.steered_top_ids, rows.unsteered_top_ids)])
        steps = steps_of(job)
        layer = ",".join(rows.layers.iloc[0])
        cells.append(f"  {layer} scale {rows.scale.iloc[0]:g}: KL {rows.kl.mean():.3g}, top token changed "
                     f"{100 * changed:.0f}%, {steps.logit_diff.mean():.4g} ({steps.corrupted_logit_diff.mean():.4g})")
        by_hand.append((layer, rows.scale.iloc[0], rows.kl.mean(), 100 * changed, steps.logit_diff.mean()))
    assert text[2:6] == cells
    assert cells[0].startswith("  transformer.h.0 scale 0: KL 0, top token changed 0%")

    from runner.analysis.report import render
    from runner.analysis.steering import steering_picture, steering_table

    page = render(path)
    assert page.index('<section id="summary">') < page.index('<section id="steering">') < page.index(
        '<section id="abnormal">')  # the picture of the answer right under it
    section = page.split('<section id="steering">', 1)[1].split("</section>", 1)[0]
    assert section.count("<img") == 1 and "kl: the mean KL(unsteered || steered)" in section
    shown = [(layer, float(scale)) for layer, scale in re.findall(r"<td>(transformer\.h\.\d)</td>\s*<td>([\d.]+)</td>",
                                                                   section)]
    assert shown == [(layer, scale) for layer, scale, *_ in by_hand]  # the table in the summary's order
    fig = steering_picture(steering_table(path))
    kl, changed, metric = fig.axes[:3]
    for ax, column in ((kl, 2), (changed, 3), (metric, 4)):
        solid = [line for line in ax.lines if line.get_linestyle() == "-"]
        assert [list(line.get_ydata()) for line in solid] == [
            pytest.approx([row[column] for row in by_hand if row[0] == layer], rel=1e-12)
            for layer in ("transformer.h.0", "transformer.h.1")]
    assert [ax.get_title() for ax in fig.axes[:3]] == ["KL(unsteered || steered), next token", "top next token changed",
                                                      "logit_diff, steered and unsteered"]
    (legend,) = fig.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["steered layer transformer.h.0", "steered layer transformer.h.1", "logit_diff steered",
                      "logit_diff unsteered"]
    colours = {line.get_color() for ax in fig.axes[:3] for line in ax.lines}
    assert colours == {handle.get_color() for handle in legend.legend_handles[:2]}  # every colour is a named layer
    assert "scale (0, 32)" in fig.get_suptitle()


def test_the_lens_answer_is_the_first_block_where_the_target_ranks_first(in_tmp):
    """README's logit-lens run: per block the share of readings whose target is the top token."""
    (lens,) = commands("tutorials/steering.md", "The logit lens", "hooks=logit_lens")
    run_dir = run_readme(lens)
    text = summarize(run_dir).splitlines()
    rows = pq.read_table(run_dir / "lens.parquet").to_pandas()
    rows = rows[rows.target >= 0]
    share = (rows.target_rank == 0).groupby([rows.block, rows.layer]).mean().reset_index(level=0, drop=True)
    first = share[share > 0.5]
    assert text[1] == (f"  logit_lens: the target first ranks first at {first.index[0]} (in {100 * first.iloc[0]:.0f}% "
                       f"of {(rows.layer == first.index[0]).sum()} readings)")
    assert text[2] == "    share of readings where it ranks first: " + ", ".join(
        f"{layer} {100 * value:.0f}%" for layer, value in share.items())
    assert share.iloc[-1] == 1.0  # the last block's reading is the model's output: the target is its top token


def test_a_sweep_patched_from_a_stored_run_answers_with_the_corrupted_run_it_is_given(in_tmp):
    """README's first patching sweep (a stored clean run), block 3 at positions 14 and 15: alone it names the clean
    metric and the cells closest to it; given the corrupted run (``runner.report --corrupted``), the recovered fractions."""
    clean, corrupted, sweep = commands("tutorials/patching.md", "Activation patching", "hooks.patch.source=runs/clean")[:3]  # then the report
    for words in (clean, corrupted):
        run_readme(words)
    path = run_readme(sweep, {"hooks.patch.layers": "transformer.h.3", "hooks.patch.index": "14,15"})
    clean_metric = steps_of(Path("runs/clean")).logit_diff.mean()
    corrupted_metric = steps_of(Path("runs/corrupted")).logit_diff.mean()
    patched = {int(dict(o.split("=", 1) for o in make_config_overrides(job))["hooks.patch.index"]):
               steps_of(job).logit_diff.mean() for job in (path / "0", path / "1")}
    alone = summarize(path).splitlines()
    assert alone[1] == (f"  activation patching of logit_diff: clean {clean_metric:.4g} (the recovered fraction needs "
                        f"the corrupted run: python -m runner.report {path} --corrupted RUN)")
    closest = sorted(patched, key=lambda i: abs(patched[i] - clean_metric))
    assert alone[2] == "  closest to clean, of 2 cells: " + ", ".join(
        f"transformer.h.3 [{i}] {patched[i]:.4g}" for i in closest)
    given = summarize(path, corrupted="runs/corrupted").splitlines()
    recovered = {i: (patched[i] - corrupted_metric) / (clean_metric - corrupted_metric) for i in patched}
    assert given[1] == f"  activation patching of logit_diff: clean {clean_metric:.4g}, corrupted {corrupted_metric:.4g}"
    assert given[2] == "  recovers most, of 2 cells: " + ", ".join(
        f"transformer.h.3 [{i}] {round(recovered[i], 2) + 0.0:.2f}" for i in sorted(recovered, key=recovered.get,
                                                                                      reverse=True))
    assert recovered[15] == pytest.approx(1.0)  # as the README says: the last block at the last position
