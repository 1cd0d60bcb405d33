"""``plan=true`` states the host bytes each entry will hold (kept tensors, a store's shard buffers,
``units``' statistics), and ``memory.budget`` refuses a plan that holds more, in one line, before
the run. The stated bytes are compared with the real tensors' ``nbytes`` in a run."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

import runner
from conftest import cli, make_config
from hooks import store_files
from runner.engine.budget import held, parse_size, size_text
from runner.engine.plan import compile_plan, describe
from runner.sources.models import build_model

MLP = ["model=mlp", "data.shape=[8,100]"]


def stated(plan) -> dict[tuple[str, str], int]:
    return {(key, what): nbytes for key, what, nbytes in held(plan.rehearsal)}


def test_kept_tensors_of_a_step_are_stated_as_the_real_outputs_bytes():
    plan = compile_plan(make_config(*MLP, "hooks=extract", "hooks.extract.layers=[fc1,fc2]"))
    model = build_model(plan.model)
    outputs = []
    for name in ("fc1", "fc2"):
        getattr(model, name).register_forward_hook(lambda m, a, out: outputs.append(out.detach().clone()))
    model(torch.randn(8, 100))
    real = sum(t.nbytes for t in outputs)  # 8x200 + 8x5 float32
    assert stated(plan) == {("extract", "kept tensors of one step"): real}
    assert f"  hooks.extract: {size_text(real)} of kept tensors of one step" in describe(plan)


def test_units_statistics_are_stated_as_the_bytes_of_the_real_accumulators(tmp_path):
    entry = {"type": "units", "layers": ["fc1", "fc2"], "top_k": 4, "second_moment": True}
    plan = compile_plan(make_config(*MLP, "hooks=units", "hooks.units.layers=[fc1,fc2]", "hooks.units.top_k=4",
                                    "hooks.units.second_moment=true"))
    model = build_model(plan.model)
    with runner.attach(model, hooks={"units": entry}, out_dir=tmp_path / "run") as run:
        for _ in range(2):  # 16 samples: every unit keeps its top and bottom 4
            with torch.no_grad():
                model(torch.randn(8, 100))
            run.step()
        accumulators = list(run.session.hooks[0].stats.values())
        real = sum(t.nbytes for stats in accumulators for t in stats.state().values() if isinstance(t, torch.Tensor))
    assert len(accumulators) == 2
    assert stated(plan) == {("units", "unit statistics"): real}


def test_a_store_s_shard_buffers_are_stated_as_their_fullest(tmp_path, monkeypatch):
    path = tmp_path / "store"
    overrides = [*MLP, "hooks=store", "hooks.store.layers=[fc1]", f"hooks.store.path={path}",
                 "hooks.store.shard_size=5", "hooks.store.dtype=float16", "loss=none", "steps=6"]
    plan = compile_plan(make_config(*overrides))
    fullest = []
    write_shard = store_files.ShardWriter._write_shard

    def measured(writer):
        fullest.append(writer._rows.nbytes + writer._ids.nbytes)
        write_shard(writer)

    monkeypatch.setattr(store_files.ShardWriter, "_write_shard", measured)
    cli([*overrides, "quiet=true"], tmp_path / "run")
    assert max(fullest) == 5 * (200 * 2 + 8)  # one shard's buffer, batches of 8 copied in: float16 + int64 ids
    assert stated(plan) == {("store", "shard buffers"): max(fullest)}


def test_a_plan_over_the_budget_is_refused_in_one_line_before_the_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli([*MLP, "hooks=extract", "hooks.extract.layers=[fc1,fc2]", "memory.budget=6KiB"], tmp_path / "run")
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: memory.budget: the entries hold 6.4 KiB on cpu (hooks.extract 6.4 KiB of kept tensors of one step), "
        "over the budget of 6.0 KiB; select fewer layers, record fewer samples (sample.batch=N), lower a store's "
        "shard_size, or raise memory.budget"]
    assert not (tmp_path / "run").exists()
    plan = compile_plan(make_config(*MLP, "hooks=extract", "hooks.extract.layers=[fc1,fc2]", "memory.budget=7KiB"))
    assert "held by the entries on cpu (the host; under torchrun, on each rank), memory.budget=7KiB:" in describe(plan)


@pytest.mark.parametrize("text,nbytes", [("2GiB", 2 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000),
                                         ("1000", 1000), ("3kib", 3072)])
def test_sizes(text, nbytes):
    assert parse_size(text, "memory.budget") == nbytes


def test_a_bad_size_is_one_line_naming_the_key():
    with pytest.raises(Exception, match=r"^memory.budget: '2 gigs' is not a size; give bytes with a unit"):
        compile_plan(make_config(*MLP, "memory.budget=2 gigs"))


def test_the_readme_memory_example_prints_its_line(tmp_path, capsys, monkeypatch):
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Big models\n", 1)[1].split("\n## ", 1)[0]
    command, line = re.search(r"^\$ (python -m runner .*memory\.budget=.*)\n(error: .*)$", section, re.M).groups()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli(shlex.split(command)[3:], tmp_path / "run")
    assert exited.value.code == 2 and capsys.readouterr().err.splitlines() == [line]
