"""The summary printed when a run or a sweep ends, against the parquet it summarises and plain PyTorch."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import runner.analysis as analysis
from conftest import cli, run_main, seeded_batch
from docs_text import page
from runner.analysis.answers.statistics import group_depth, layer_group
from runner.analysis.summary import summarize
from runner.sources.models import ConvNet

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]


def _printed(capsys) -> str:
    out = capsys.readouterr().out
    return out[out.index("\nrun ") + 1:]


def test_clip_summary_counts_the_clipped_elements_of_the_parquet_and_of_a_hand_written_clamp(tmp_path, capsys):
    cli(["model=convnet", "hooks=clip"], tmp_path / "run")
    text = _printed(capsys)
    assert text == summarize(tmp_path / "run") + "\n"
    # from the parquet: what clamp removed is 0 exactly where nothing was clipped
    table = pq.read_table(tmp_path / "run" / "stats.parquet").to_pandas()
    rows = table[table["kind"] == "clipped"]
    clipped = np.rint(rows["numel"] * (1 - rows["zero_frac"])).astype(int)
    assert f"clipped {(clipped > 0).sum()} of {len(rows)} gradients, {clipped.sum():,} of {rows['numel'].sum():,} " \
           f"elements ({100 * clipped.sum() / rows['numel'].sum():.1f}%)" in text
    # by hand: the same model and batch, the gradient elements beyond the bound of hooks=clip (0.01)
    torch.manual_seed(0)
    model = ConvNet()
    model(seeded_batch([1, 3, 8, 8])).sum().backward()
    beyond = {name: int((p.grad.abs() > 0.01).sum()) for name, p in model.named_parameters()}
    numel = {name: p.numel() for name, p in model.named_parameters()}
    assert clipped.sum() == sum(beyond.values()) and rows["numel"].sum() == sum(numel.values())
    for group in ("conv", "fc"):
        share = sum(v for k, v in beyond.items() if k.startswith(group)) / sum(
            v for k, v in numel.items() if k.startswith(group))
        assert f"{group} {100 * share:.1f}%" in text.splitlines()[2]
    assert text.splitlines()[-1] == f"report: python -m runner.report {tmp_path / 'run'}"


def test_stats_summary_names_the_largest_and_smallest_gradient_norms_and_the_dead_layers(tmp_path, capsys):
    cli(["model=mlp", "hooks=stats", "steps=2"], tmp_path / "run")
    text = _printed(capsys)
    stats = analysis.load_stats(tmp_path / "run", filters=[("kind", "=", "grad_output")])
    norm = stats.groupby("layer", observed=True)["l2"].mean()
    line = next(line for line in text.splitlines() if "gradient l2" in line)
    assert f"largest {norm.idxmax()} {norm.max():.3g}, smallest {norm.idxmin()} {norm.min():.3g}" in line
    steps = analysis.load_steps(tmp_path / "run")
    assert f"2 step(s), last loss {steps.loss.iloc[-1]:.4g}" in text
    found = analysis.abnormal(analysis.load_stats(tmp_path / "run"))
    if found.empty:
        assert "no dead or non-finite layer" in text
    else:
        assert all(problem in text for problem in found["problem"])


def test_a_dead_layer_is_named(tmp_path, capsys):
    """An ablation that zeroes every channel of conv: its output is 0 everywhere, and the summary says so."""
    cli(["model=convnet", "hooks=[ablate,stats]", "hooks.ablate.layers=conv", "hooks.stats.layers=conv"],
        tmp_path / "run")
    text = _printed(capsys)
    assert re.search(r"all zero: conv\b", text), text


def test_quiet_prints_no_summary(tmp_path, capsys):
    cli(["model=convnet", "hooks=clip", "quiet=true"], tmp_path / "run")
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'run'}"


def test_a_run_without_entries_is_summarised_from_its_steps_without_pandas(tmp_path, capsys):
    """The line every run ends with is read with pyarrow alone (importing pandas is a third of a second
    of CPU) and says what the loaders' frame holds: the steps of each split and their last losses."""
    run_dir = tmp_path / "run"
    cli(["model=mlp", "hooks=none", "steps=4", "eval_every=2"], run_dir)
    printed = capsys.readouterr().out.splitlines()[1:]  # after 'wrote RUN_DIR'
    steps = analysis.load_steps(run_dir)
    train, evals = steps[steps.split == "train"], steps[steps.split == "eval"]
    assert printed[0] == (f"run {run_dir}: {len(train)} step(s), last loss {train.loss.iloc[-1]:.4g}, "
                          f"last eval loss {evals.loss.iloc[-1]:.4g}") and len(train) == 4 and len(evals) > 0
    code = "import sys; from runner.cli.summary import print_summary; print_summary(sys.argv[1], False); " \
           "print(sorted({'pandas', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code, str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.stdout.splitlines() == [*printed, "[]"], done.stderr


def test_sweep_summary_is_a_table_of_the_swept_values_in_command_line_order(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    done = run_main(monkeypatch, capsys, "-m", "model=convnet", "hooks=clip", "hooks.clip.min=-1",
                    "hooks.clip.max=0.1,0.01,1", f"hydra.sweep.dir={sweep}")
    assert done.code == 0, done.stderr
    text = done.stdout[done.stdout.index(f"sweep {sweep}"):]
    assert text == summarize(sweep) + "\n"
    lines = text.splitlines()
    assert lines[1].split() == ["hooks.clip.max", "loss", "clipped"]
    stats = analysis.load_stats(sweep, filters=[("kind", "=", "clipped")])
    losses = analysis.load_steps(sweep).groupby("hooks.clip.max").loss.last()
    for line, bound in zip(lines[2:5], (0.1, 0.01, 1)):
        rows = stats[stats["hooks.clip.max"] == bound]
        share = np.rint(rows.numel * (1 - rows.zero_frac)).sum() / rows.numel.sum()
        assert line.split() == [f"{bound:g}", f"{losses[bound]:.4g}", f"{100 * share:.1f}%"]
    assert lines[-1] == f"report: python -m runner.report {sweep}"


@pytest.mark.parametrize("layers, depth, groups", [
    (["conv1", "layer1.0.conv1", "layer1.1.conv1", "layer4.1.bn2", "fc"], 1, {"conv1", "layer1", "layer4", "fc"}),
    (["transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.1.mlp"], 3, {"transformer.h.0", "transformer.h.1"}),
])
def test_layer_groups_split_at_the_first_level_that_differs(layers, depth, groups):
    assert group_depth(layers) == depth
    assert {layer_group(layer, depth) for layer in layers} == groups


@pytest.mark.parametrize("name", ["README.md", "index.md"])
def test_the_front_pages_show_what_the_run_prints(tmp_path, capsys, name):
    block = page(name).split("$ python -m runner model=convnet 'hooks=[clip,stats]'\n", 1)[1].split("```", 1)[0]
    shown_dir = re.search(r"^wrote (\S+)$", block, re.MULTILINE).group(1)
    cli(["model=convnet", "hooks=[clip,stats]"], tmp_path / "run")
    assert capsys.readouterr().out == block.replace(shown_dir, str(tmp_path / "run"))


def test_warnings_on_the_command_line_are_one_line_and_the_nonfinite_advice_fits_the_hooks(tmp_path, monkeypatch,
                                                                                          capsys, recwarn):
    def warned(*overrides):  # each warning as the command line prints it: with the format main() installs
        recwarn.clear()
        done = run_main(monkeypatch, capsys, *overrides, "quiet=true",
                        f"hydra.run.dir={tmp_path / str(len(list(tmp_path.iterdir())))}")
        assert done.code == 0, done.stderr
        printed = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in recwarn)
        return [line for line in printed.splitlines() if "NonFiniteWarning" in line or line.startswith(" ")]

    with_outputs = warned("model=mlp", "hooks=stats", "loss=log_mean")
    assert with_outputs == ["warning: NonFiniteWarning: step 0: the loss is nan while every hooked tensor was finite; "
                            "the loss function likely made it (e.g. the log of a negative output); later steps are "
                            "not reported (see nan_count/inf_count)"]
    assert "hooks=stats" not in with_outputs[0]
    gradients_only = warned("model=mlp", "hooks=clip", "loss=log_mean")
    assert len(gradients_only) == 1 and "hook more layers (e.g. hooks=stats)" in gradients_only[0]


def test_stats_without_a_loss_suggests_recording_the_forward_pass_only(tmp_path, monkeypatch, capsys):
    done = run_main(monkeypatch, capsys, "model=convnet", "hooks=stats", "loss=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.code == 2 and done.stderr == (
        "error: hooks.stats: 'stats' needs a backward pass but loss=none; choose a loss (e.g. loss=sum), record the "
        "forward pass only (hooks.stats.kinds=[output]), or drop the entry\n")
    assert not (tmp_path / "run").exists()


def test_a_run_of_several_ranks_counts_the_run_total_rows_of_every_rank_s_part(tmp_path):
    """An FSDP run writes each rank's ``units.parquet`` in its ``rank-N`` part: the summary counts them all
    (the parts are two one-process runs committed as torchrun commits its ranks, as in test_summary_ranks)."""
    import json
    import shutil

    from torch import nn

    import runner
    from common.records import CONFIG, MANIFEST
    from runner.analysis.summary import summarize_run

    run = tmp_path / "ranks"
    for rank in range(2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        with runner.attach(model, hooks={"units": {"type": "units", "layers": "1"}}, out_dir=run / f"rank-{rank}") as r:
            r.samples(torch.arange(4) + 4 * rank)
            model(torch.randn(4, 6, generator=torch.Generator().manual_seed(rank)))
            r.step()
        manifest = json.loads((run / f"rank-{rank}" / MANIFEST).read_text())
        (run / f"rank-{rank}" / MANIFEST).write_text(json.dumps({**manifest, "rank": rank, "world_size": 2}))
    shutil.copy(run / "rank-0" / CONFIG, run / CONFIG)
    (run / MANIFEST).write_text(json.dumps({"run_id": "hand-made", "files": {CONFIG: {}},
                                            "ranks": {"0": "rank-0", "1": "rank-1"}}))
    rows = sum(pq.ParquetFile(run / f"rank-{rank}" / "units.parquet").metadata.num_rows for rank in range(2))
    assert rows == 16  # 8 units on each rank
    assert f"    wrote {rows} rows of units.parquet" in summarize_run(run)
