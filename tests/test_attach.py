"""``runner.attach``: a plain PyTorch loop writes the tables the CLI writes, with the CLI's guarantees."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from common.errors import ConfigError
import runner
import runner.analysis as analysis
from conftest import assert_no_partial_output, assert_same_tables, hook_count, hook_snapshot, make_config, run
from runner.engine.plan import compile_plan
from runner.engine.train import EVAL_SEED_OFFSET
from runner.sources.models import ConvNet

pytestmark = pytest.mark.statistics

CLI = ("model=convnet", "hooks=[clip,stats]", "hooks.clip.max=0.001", "loss=cross_entropy", "optimizer=sgd",
       "optimizer.lr=0.5", "steps=4")


def _plain_loop(out_dir, steps: int = 4):
    """The CLI run ``CLI`` written as a user's own loop: same seed, batches, loss and optimizer."""
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = compile_plan(make_config(*CLI)).data.batches(0, torch.device("cpu"))
    with runner.attach(model, hooks=["clip", "stats"], overrides=["hooks.clip.max=0.001"], out_dir=out_dir) as rec:
        for _ in range(steps):
            batch = next(batches)
            opt.zero_grad(set_to_none=True)
            out = model(batch.x)
            loss = F.cross_entropy(out, batch.targets)
            accuracy = (out.argmax(1) == batch.targets).float().mean().item()
            rec.backward(loss)
            opt.step()
            rec.step(loss, accuracy=accuracy)
    return model


def test_a_plain_loop_writes_the_tables_the_cli_writes(tmp_path):
    cli_dir = run(make_config(*CLI), tmp_path / "cli", CLI)
    model = _plain_loop(tmp_path / "mine")
    assert hook_count(model) == 0
    assert_same_tables(tmp_path / "mine", cli_dir)
    steps_cli = pd.read_parquet(cli_dir / "steps.parquet")
    assert steps_cli["loss"].iloc[-1] != steps_cli["loss"].iloc[0]  # the optimizer stepped: the loss moved
    assert (tmp_path / "mine" / "manifest.json").is_file()
    written = (tmp_path / "mine" / "config.yaml").read_text()
    assert "max: 0.001" in written and "type: stats" in written


def test_the_clip_entry_changes_what_the_plain_loop_learns(tmp_path):
    """The clip entry acts on the user's optimizer: the weights differ from a loop without it."""
    clipped = _plain_loop(tmp_path / "clipped", steps=2)
    torch.manual_seed(0)
    plain = ConvNet()
    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    batches = compile_plan(make_config(*CLI)).data.batches(0, torch.device("cpu"))
    for _ in range(2):
        batch = next(batches)
        opt.zero_grad(set_to_none=True)
        grads = F.cross_entropy(plain(batch.x), batch.targets)
        grads.backward()
        for p in plain.parameters():
            p.grad.clamp_(-0.01, 0.001)
        opt.step()
    for a, b in zip(clipped.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kwargs, message", [
    ({"hooks": ["clip"], "overrides": ["hooks.clip.maxx=1"]}, "hooks.clip.maxx"),
    ({"hooks": ["clp"]}, "clip"),
    ({"hooks": {"mine": {"type": "clmp", "layers": "**"}}}, "hooks.mine.type"),
    ({"hooks": {"mine": {"type": "stats", "layers": "nosuchlayer"}}}, "hooks.mine.layers"),
    ({"hooks": ["stats"], "steps": 3}, "steps"),
    ({"hooks": ["stats"], "on_silent": "loud"}, "on_silent"),
])
def test_a_bad_entry_is_one_line_before_anything_is_attached_or_written(tmp_path, kwargs, message):
    model = ConvNet()
    before = hook_snapshot(model)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        with runner.attach(model, out_dir=out, **kwargs):
            pytest.fail("the block must not run")
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, err.value
    assert hook_snapshot(model) == before
    assert not out.exists()


def test_an_exception_in_the_block_removes_the_hooks_and_writes_nothing_final(tmp_path):
    model = ConvNet()
    before = hook_snapshot(model)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="user's bug"):
        with runner.attach(model, hooks=["stats"], out_dir=out) as rec:
            assert hook_count(model) > 0
            loss = model(torch.randn(2, 3, 8, 8)).sum()
            rec.backward(loss)
            rec.step(loss)
            raise RuntimeError("user's bug")
    assert hook_snapshot(model) == before
    assert_no_partial_output(out)


def test_an_unknown_measure_is_one_line(tmp_path):
    model = ConvNet()
    with pytest.raises(ConfigError, match="per-step measure"):
        with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "out") as rec:
            rec.step(model(torch.randn(1, 3, 8, 8)).sum(), top5=0.3)
    assert hook_count(model) == 0
    assert_no_partial_output(tmp_path / "out")


def test_import_runner_stays_light():
    code = "import sys, runner; assert 'torch' not in sys.modules; runner.attach; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_entries_given_as_a_mapping_record_what_they_name(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    with runner.attach(model, hooks={"mine": {"type": "stats", "layers": "fc", "kinds": ["output"]}},
                       out_dir=tmp_path / "out", sample={"every": 2}) as rec:
        for _ in range(3):
            rec.step(model(x).sum())
    stats = analysis.load_stats(tmp_path / "out")
    assert sorted(stats.step) == [0, 2] and set(stats.layer) == {"fc"} and set(stats.hook) == {"mine"}
    with torch.no_grad():
        np.testing.assert_allclose(stats["mean"], [model(x).mean().item()] * 2, rtol=1e-6)


def test_lifetimes_end_with_the_last_step_that_ran(tmp_path):
    """The step after the last one is begun for the loop, which never runs it: no entry ends or starts there."""
    import json

    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    entries = {"early": {"type": "stats", "layers": "fc", "kinds": ["output"], "steps": [0, 3]},
               "late": {"type": "stats", "layers": "fc", "kinds": ["output"], "steps": [3, 5]}}
    with runner.attach(model, hooks=entries, out_dir=tmp_path / "out", on_silent="ignore") as rec:
        for _ in range(3):
            rec.step(model(x).sum())
    lifetimes = json.loads((tmp_path / "out" / "manifest.json").read_text())["lifetimes"]
    assert lifetimes["hooks.early"] == {"attached_at_step": 0, "removed_at_step": None, "calls": 3}
    assert lifetimes["hooks.late"] == {"attached_at_step": None, "removed_at_step": None, "calls": 0}


def test_eval_passes_in_a_plain_loop_write_the_eval_rows_the_cli_writes(tmp_path):
    """``run.evaluating()`` after every 2nd step, on the CLI's held-out batches, gives the tables of
    ``eval_every=2``: phase ``eval`` captures and ``split=eval`` rows, none mixed into training steps."""
    overrides = (*CLI, "eval_every=2", "eval_steps=2")
    cli_dir = run(make_config(*overrides), tmp_path / "cli", overrides)
    plan = compile_plan(make_config(*overrides))
    held_out = plan.schedule.held_out(plan.data.batches(EVAL_SEED_OFFSET, torch.device("cpu"), held_out=True))
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = plan.data.batches(0, torch.device("cpu"))
    with runner.attach(model, hooks=["clip", "stats"], overrides=["hooks.clip.max=0.001"],
                       out_dir=tmp_path / "mine") as rec:
        for step in range(4):
            batch = next(batches)
            opt.zero_grad(set_to_none=True)
            out = model(batch.x)
            loss = F.cross_entropy(out, batch.targets)
            rec.backward(loss)
            opt.step()
            rec.step(loss, accuracy=(out.argmax(1) == batch.targets).float().mean().item())
            if step % 2 == 1:
                model.eval()
                with torch.no_grad(), rec.evaluating() as result:
                    outs = [model(b.x) for b in held_out]
                    losses = [F.cross_entropy(o, b.targets).item() for o, b in zip(outs, held_out)]
                    right = sum(int((o.argmax(1) == b.targets).sum()) for o, b in zip(outs, held_out))
                    result.set(sum(losses) / len(losses), accuracy=right / sum(len(b.targets) for b in held_out))
                model.train()
    _, theirs = assert_same_tables(tmp_path / "mine", cli_dir)
    assert set(theirs.phase) >= {"eval", "forward", "backward"}
    assert list(pd.read_parquet(cli_dir / "steps.parquet").split) == ["train", "train", "eval", "train", "train", "eval"]


def test_eval_passes_before_the_first_step_are_one_line(tmp_path):
    with runner.attach(ConvNet(), hooks=["stats"], out_dir=tmp_path / "run", on_silent="ignore") as rec:
        with pytest.raises(ConfigError, match=r"^run.evaluating\(\): .* no run.step\(\) has ended one yet"):
            with rec.evaluating():
                pass
        rec.step(None)


def test_a_patch_entry_in_your_own_loop_is_one_line_where_its_values_are_missing(tmp_path):
    """A clean pass is the runner loop's; eval passes have no recorded values: both one line."""
    clean = {"p": {"type": "patch", "layers": "conv", "source": "clean"}}
    with pytest.raises(ConfigError, match=r"^hooks.p.source: clean needs the runner's loop, .*source=RUN_DIR$"):
        with runner.attach(ConvNet(), hooks=clean, out_dir=tmp_path / "never"):
            pass
    assert not (tmp_path / "never").exists()
    model, x = ConvNet(), torch.randn(2, 3, 8, 8)
    with runner.attach(model, hooks=["extract"], overrides=["hooks.extract.layers=conv"],
                       out_dir=tmp_path / "src") as rec:
        model(x)
        rec.step(None)
    stored = {"p": {"type": "patch", "layers": "conv", "source": str(tmp_path / "src")}}
    with runner.attach(model, hooks=stored, out_dir=tmp_path / "run") as rec:
        model(x)
        rec.step(None)
        with pytest.raises(ConfigError, match=r"^run.evaluating\(\): hooks.p: 'patch' patches in values recorded "
                                              r"for each training step's batch, .*; evaluate in a run without the entry$"):
            with rec.evaluating():
                pass
