"""One loop: the CLI's run and ``runner.attach`` are one run object; what is recorded after backward
does not depend on who calls ``backward``; ``runner.attach`` rehearses at the first call; ``runner/``
names no hook type."""
from __future__ import annotations

import ast
from pathlib import Path

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
from runner.sources.models import ConvNet
from runner.store.outputs import STATS_SCHEMA

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
CLI = ("model=convnet", "hooks=[clip,stats,extract]", "hooks.clip.max=0.001", "hooks.extract.layers=fc",
       "loss=cross_entropy", "optimizer=sgd", "optimizer.lr=0.5", "steps=3")


def _loop_with_loss_backward(out_dir, steps: int = 3, optimizer: bool = True):
    """The CLI run ``CLI`` as every PyTorch loop is written: ``loss.backward()``, no ``run.backward``."""
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = compile_plan(make_config(*CLI)).data.batches(0, torch.device("cpu"))
    with runner.attach(model, hooks=["clip", "stats", "extract"],
                       overrides=["hooks.clip.max=0.001", "hooks.extract.layers=fc"], out_dir=out_dir) as rec:
        for _ in range(steps):
            batch = next(batches)
            opt.zero_grad(set_to_none=True)
            out = model(batch.x)
            loss = F.cross_entropy(out, batch.targets)
            loss.backward()
            if optimizer:
                opt.step()
            rec.step(loss, accuracy=(out.argmax(1) == batch.targets).float().mean().item())
    return model


def test_loss_backward_in_a_plain_loop_gives_the_tables_of_the_cli(tmp_path):
    cli_dir = run(make_config(*CLI), tmp_path / "cli", CLI)
    model = _loop_with_loss_backward(tmp_path / "mine")
    assert hook_count(model) == 0
    _, theirs = assert_same_tables(tmp_path / "mine", cli_dir)
    assert set(theirs.phase) == {"forward", "backward", "after_backward"}
    kept_mine, kept_cli = analysis.load_tensors(tmp_path / "mine"), analysis.load_tensors(cli_dir)
    assert len(kept_mine) == len(kept_cli) > 0
    for a, b in zip(kept_mine["tensor"], kept_cli["tensor"]):
        np.testing.assert_array_equal(a, b)
    ids = [c for c in STATS_SCHEMA.names if c in kept_cli.columns]
    pd.testing.assert_frame_equal(kept_mine[ids], kept_cli[ids])


def test_after_backward_rows_are_the_accumulated_grad_whoever_calls_backward(tmp_path):
    """No optimizer and ``loss.backward()``: the rows are written when the step ends, and hold each
    parameter's ``.grad`` clamped as the clip entry clamps it (hand-written: float64 norms)."""
    torch.manual_seed(0)
    model = ConvNet()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    with runner.attach(model, hooks=["clip"], overrides=["hooks.clip.max=0.001"], out_dir=tmp_path / "run") as rec:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        rec.step(loss)
        grads = {name: p.grad.double() for name, p in model.named_parameters()}
    after = analysis.load_stats(tmp_path / "run")
    after = after[after.phase == "after_backward"]
    assert sorted(f"{r.layer}.{r.slot}" for r in after.itertuples()) == sorted(grads)
    plain = ConvNet()
    plain.load_state_dict(model.state_dict())
    F.cross_entropy(plain(x), y).backward()
    for row in after.itertuples():
        expected = dict(plain.named_parameters())[f"{row.layer}.{row.slot}"].grad.double().clamp(-0.01, 0.001)
        torch.testing.assert_close(grads[f"{row.layer}.{row.slot}"], expected)
        assert row.l2 == pytest.approx(float(expected.norm()), rel=1e-6)


def test_after_backward_is_recorded_once_per_optimizer_step_after_gradient_accumulation(tmp_path):
    """Two micro-batches, one optimizer step: one row per parameter, the sum of both gradients."""
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = torch.randn(2, 4, 3, 8, 8), torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])
    with runner.attach(model, hooks={"g": {"type": "scale", "layers": "fc", "factor": 1.0}},
                       out_dir=tmp_path / "run") as rec:
        for x, y in zip(xs, ys):
            F.cross_entropy(model(x), y).backward()
        accumulated = model.fc.weight.grad.double().clone()
        opt.step()
        opt.zero_grad()
        rec.step()
    rows = analysis.load_stats(tmp_path / "run")
    after = rows[(rows.phase == "after_backward") & (rows.slot == "weight")]
    assert len(after) == 1 and after.l2.iloc[0] == pytest.approx(float(accumulated.norm()), rel=1e-6)


def test_the_first_call_rehearsal_names_a_shape_mistake_before_anything_is_computed(tmp_path):
    """A residual across a shape change (conv: [N, 3, 8, 8] -> [N, 10, 4, 4]): one line from the first
    call, which never ran on the real input; hooks removed, nothing final written."""
    model = ConvNet()
    before = hook_snapshot(model)
    real_calls = []
    handle = model.conv.register_forward_hook(lambda m, a, out: real_calls.append(out.device.type))
    with pytest.raises(ConfigError) as err:
        with runner.attach(model, hooks={"res": {"type": "edit_output", "layers": "conv", "op": "add_input"}},
                           out_dir=tmp_path / "run") as rec:
            rec.step(model(torch.randn(2, 3, 8, 8)).sum())
    handle.remove()
    # the module it matched, with its input's and output's shapes (the rehearsal's batch of 2)
    assert str(err.value) == ("hooks.res.op: add_input on module 'conv' adds its input [2, 3, 8, 8] to its output "
                              "[2, 10, 4, 4], which differ in shape: select a module that keeps the shape "
                              "(hooks.res.layers)")
    assert len(str(err.value).splitlines()) == 1
    assert real_calls == ["meta"]  # the rehearsal's pass only
    assert hook_snapshot(model) == before
    assert_no_partial_output(tmp_path / "run")


def test_the_first_call_rehearsal_checks_an_index_against_the_real_shapes(tmp_path):
    model = ConvNet()
    with pytest.raises(ConfigError, match=r"^hooks\.s\.index"):
        with runner.attach(model, hooks={"s": {"type": "shift", "layers": "fc", "index": [2, 999]}},
                           out_dir=tmp_path / "run"):
            model(torch.randn(2, 3, 8, 8))
    assert hook_count(model) == 0


def test_the_rehearsal_leaves_nothing_on_the_model_and_draws_no_random_number(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    seen = {}
    with runner.attach(model, hooks=["clip", "stats"], out_dir=tmp_path / "run") as rec:
        attached = hook_count(model)
        state = torch.get_rng_state()
        user = model.register_forward_pre_hook(lambda m, a: seen.update(rng=torch.get_rng_state()))
        loss = model(x).sum()
        user.remove()
        # the one-shot pre-hooks (with kwargs: two dict entries each) left at the first call
        assert hook_count(model) == attached - 2 * len(list(model.modules()))
        loss.backward()
        rec.step(loss)
        assert torch.equal(seen["rng"], state)
        assert rec.rehearsal is not None and ("conv", "Conv2d", "[2, 10, 4, 4]") in rec.rehearsal.modules
        tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
        assert not any(t.is_meta for t in tensors)
        assert not any(isinstance(v, torch.Tensor) and v.is_meta for m in model.modules() for v in vars(m).values())
    assert hook_count(model) == 0


def _entry_state(plan) -> list[dict[str, str]]:
    """What each of the plan's entry objects holds beyond its spec (``repr``s: tensors and dicts compare)."""
    return [{key: repr(value) for key, value in vars(hook).items()} for hook in plan.hooks]


def test_a_plan_runs_twice_the_same_its_entries_state_is_fresh_at_each_run(tmp_path):
    """The plan holds specs: its rehearsal and each run attach fresh copies, so neither loads the stored
    run (``patch``) nor the samples (``ablate: resample``) into the plan's own entries."""
    shape = ("model=convnet", "data.shape=[4,3,8,8]", "loss=sum", "steps=2")
    source = run(make_config(*shape, "hooks=extract", "hooks.extract.layers=conv"), tmp_path / "source")
    overrides = (*shape, "hooks=[ablate,patch,stats]", "hooks.ablate.op=resample", "hooks.ablate.layers=conv",
                 f"hooks.patch.source={source}", "hooks.patch.layers=conv", "hooks.stats.layers=fc")
    plan = compile_plan(make_config(*overrides), overrides)
    assert plan.rehearsal is not None  # the rehearsal attached the entries (and loaded the stored run)
    unattached = [{key: repr(value) for key, value in vars(hook.fresh()).items()} for hook in plan.hooks]
    assert _entry_state(plan) == unattached
    from runner.engine import loop
    first, second = loop.run(plan, tmp_path / "a"), loop.run(plan, tmp_path / "b")
    assert _entry_state(plan) == unattached
    a, b = analysis.load_stats(first), analysis.load_stats(second)
    assert set(a.hook) == {"ablate", "patch", "stats"}
    pd.testing.assert_frame_equal(a[STATS_SCHEMA.names], b[STATS_SCHEMA.names])


def _hook_type_modules() -> set[str]:
    """The modules of ``hooks/`` that register a hook type."""
    return {f"hooks.{p.stem}" for p in (ROOT / "hooks").glob("*.py") if "@register(" in p.read_text()}


def test_runner_imports_no_hook_type_module():
    """Hook types declare what they need (``HookType``); ``runner/`` supplies it without naming a type."""
    types = _hook_type_modules()
    assert {"hooks.types.interventions", "hooks.types.gradients", "hooks.types.observe"} <= types
    found = []
    for path in (ROOT / "runner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in types | {"hooks.kernels.stats"}:
                found.append(f"{path.relative_to(ROOT)}: from {node.module}")
    assert not found, found
