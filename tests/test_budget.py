"""``plan=true`` states the host bytes each entry will hold (kept tensors, a store's shard buffers,
``units``' statistics), and ``memory.budget`` refuses a plan that holds more, in one line, before
the run. The stated bytes are compared with the real tensors' ``nbytes`` in a run."""
from __future__ import annotations

import re
import shlex

import pytest
import torch

import runner
from common.errors import ConfigError
from conftest import assert_no_partial_output, cli, hook_snapshot, make_config
from test_shards import one_rank_mesh  # noqa: F401  (the fixture: FSDP2 on a process group of one)
from hooks.formats import store_files
from runner.engine.budget import held, parse_size, size_text
from runner.engine.plan import compile_plan, describe
from runner.sources.models import build_model
from docs_text import section

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


EXTRACT = ["hooks=extract", "hooks.extract.layers=[fc1,fc2]"]


def cli_line(tmp_path, capsys, *overrides: str) -> str | None:
    """The CLI's one error line for ``overrides`` (``None``: it ran)."""
    try:
        cli([*MLP, *EXTRACT, *overrides, "quiet=true"], tmp_path / "cli" / "-".join(overrides))
    except SystemExit as exited:
        assert exited.code == 2
        [line] = capsys.readouterr().err.splitlines()
        return line.removeprefix("error: ")
    return None


def attach_line(tmp_path, budget: str, **settings) -> str | None:
    """``runner.attach``'s one error line for the same entries on the same model, batch and budget
    (``None``: it ran); a refusal comes from the first call, before it computes anything."""
    model = build_model(compile_plan(make_config(*MLP)).model)
    before, real_calls = hook_snapshot(model), []
    handle = model.fc1.register_forward_hook(lambda m, a, out: real_calls.append(out.device.type))
    out = tmp_path / f"attach-{budget}"
    try:
        with runner.attach(model, hooks=["extract"], overrides=EXTRACT[1:], out_dir=out, memory={"budget": budget},
                           **settings) as run:
            model(torch.randn(8, 100)).sum().backward()
            run.step()
    except ConfigError as exc:
        assert real_calls == ["meta"]  # the rehearsal's pass only
        assert_no_partial_output(out)
        return str(exc)
    finally:
        handle.remove()
        assert hook_snapshot(model) == before
    assert real_calls == ["meta", "cpu"] and (out / "tensors.parquet").is_file()
    return None


def test_attach_obeys_the_budget_as_the_command_line_does_in_a_caller_s_words(tmp_path, capsys):
    refused = cli_line(tmp_path, capsys, "memory.budget=6KiB")
    assert refused.endswith("(sample.batch=N), lower a store's shard_size, or raise memory.budget")
    python_words = refused.replace("sample.batch=N", "sample={'batch': N}").replace(
        "raise memory.budget", "raise memory={'budget': SIZE}")
    assert attach_line(tmp_path, "6KiB") == python_words
    assert cli_line(tmp_path, capsys, "memory.budget=7KiB") is None and attach_line(tmp_path, "7KiB") is None


def test_sampling_fewer_rows_brings_a_plan_under_the_budget_as_the_remedy_says(tmp_path, capsys):
    """``sample.batch=1`` keeps one row of 8: 1/8 of the 6.4 KiB, under 1 KiB, from the CLI and ``runner.attach``."""
    assert cli_line(tmp_path, capsys, "memory.budget=1KiB", "sample.batch=1") is None
    assert attach_line(tmp_path, "1KiB", sample={"batch": 1}) is None
    assert "hooks.extract 820 B of kept tensors" in cli_line(tmp_path, capsys, "memory.budget=800B", "sample.batch=1")
    assert "hooks.extract 820 B of kept tensors" in attach_line(tmp_path, "800B", sample={"batch": 1})


@pytest.mark.parametrize("text,nbytes", [("2GiB", 2 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000),
                                         ("1000", 1000), ("3kib", 3072)])
def test_sizes(text, nbytes):
    assert parse_size(text, "memory.budget") == nbytes


def test_a_bad_size_is_one_line_naming_the_key():
    with pytest.raises(Exception, match=r"^memory.budget: '2 gigs' is not a size; give bytes with a unit"):
        compile_plan(make_config(*MLP, "memory.budget=2 gigs"))


def test_the_readme_memory_example_prints_its_line(tmp_path, capsys, monkeypatch):
    text = section("how-to/big-models.md", "Big models")
    command, line = re.search(r"^\$ (python -m runner .*memory\.budget=.*)\n(error: .*)$", text, re.M).groups()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli(shlex.split(command)[3:], tmp_path / "run")
    assert exited.value.code == 2 and capsys.readouterr().err.splitlines() == [line]


class DataDependent(torch.nn.Module):
    """A branch on a value (``.item()``): the meta device cannot run it, so nothing plans what entries hold."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(x) if x.sum().item() > 0 else x


def test_attach_refuses_a_budget_for_a_model_its_first_call_cannot_rehearse(tmp_path):
    model = DataDependent()
    with pytest.raises(ConfigError) as refused:
        with runner.attach(model, hooks={"keep": {"type": "capture", "layers": "fc1"}}, out_dir=tmp_path / "run",
                           memory={"budget": "1GiB"}):
            model(torch.ones(2, 4))
    assert str(refused.value) == ("memory.budget: the model cannot run on the meta device, so what its entries hold "
                                  "cannot be planned; run without memory.budget")
    assert_no_partial_output(tmp_path / "run")
    with runner.attach(model, hooks={"keep": {"type": "capture", "layers": "fc1"}}, out_dir=tmp_path / "free") as run:
        model(torch.ones(2, 4))  # without a budget the same call runs
        run.step()
    assert (tmp_path / "free" / "tensors.parquet").is_file()


def test_attach_refuses_a_budget_for_a_sharded_model_before_anything_runs(one_rank_mesh, tmp_path):
    """FSDP2's parameters are gathered in its own pre-forward: the first call is not rehearsed, so a budget
    has nothing to be checked against."""
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 4)), mesh=one_rank_mesh)
    with pytest.raises(ConfigError, match=r"^memory.budget: a sharded \(FSDP2\) model is not rehearsed on the meta "
                                          r"device, so what its entries hold cannot be planned; run without memory.budget$"):
        with runner.attach(model, hooks={"keep": {"type": "capture", "layers": "0"}}, out_dir=tmp_path / "run",
                           memory={"budget": "1GiB"}):
            raise AssertionError("refused when attached, before the block")
    assert_no_partial_output(tmp_path / "run")
