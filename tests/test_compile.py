"""``torch.compile`` with ``runner.attach``: entries go on the model before it is compiled, never after,
and a compiled model records what the eager one records. The compiled runs are in marker group
``compiled`` (minutes of compilation on two cores): ``python -m pytest -q -m compiled``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters  # PyTorch's graph-break counts (no public counter)

from common.errors import ConfigError
import runner
import runner.analysis as analysis
from conftest import docs_block
from runner.sources.models import gpt2_tiny

IDS = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
STATS = ["mean", "std", "min", "max", "abs_mean", "l2", "zero_frac"]


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test compiles from scratch: compiled code is kept per class and does not check hooks, so
    an MLP compiled by an earlier test would lend its code (its hooks or none) to this test's MLP."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("compile_it", [lambda m: torch.compile(m), lambda m: m.compile() or m,
                                        lambda m: torch.nn.Sequential(torch.compile(m))],
                         ids=["torch.compile", "Module.compile", "compiled-submodule"])
def test_an_entry_attached_to_a_compiled_model_is_refused_in_one_line(tmp_path, compile_it):
    model = compile_it(mlp())
    with pytest.raises(ConfigError, match=r"already compiled with torch.compile, and compiled code never runs hooks "
                                          r"added after it; attach to the model first") as info:
        with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "run"):
            pass
    assert "\n" not in str(info.value) and not (tmp_path / "run").exists()


def run(model: torch.nn.Module, entries: dict, batches: list, out: Path, compiled: bool, loss_fn,
        model_breaks: str = "(none)") -> Path:
    """Train ``model`` on ``batches`` under ``entries``; with ``compiled``, through ``torch.compile`` made
    inside the block (the entries already attached), and assert that no call broke the graph but the
    model's own code (reasons starting with ``model_breaks``): the entries' hooks and ``runner.attach``'s
    first-call rehearsal are traced into it."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with runner.attach(model, hooks=entries, out_dir=out) as session:
        forward = torch.compile(model) if compiled else model
        for batch in batches:
            counters.clear()
            loss = loss_fn(forward, *batch)
            assert [reason for reason in counters["graph_break"] if not reason.startswith(model_breaks)] == []
            session.backward(loss)
            session.step(loss)
            opt.step()
            opt.zero_grad()
    return out


def assert_same_records(eager: Path, compiled: Path) -> None:
    a = analysis.load_stats(eager).sort_values(IDS).reset_index(drop=True)
    b = analysis.load_stats(compiled).sort_values(IDS).reset_index(drop=True)
    assert len(a) > 0 and a[IDS].values.tolist() == b[IDS].values.tolist()
    np.testing.assert_allclose(b[STATS].to_numpy(float), a[STATS].to_numpy(float), rtol=1e-4, atol=1e-6)
    kept_a = analysis.load_tensors(eager).sort_values(IDS).reset_index(drop=True)
    kept_b = analysis.load_tensors(compiled).sort_values(IDS).reset_index(drop=True)
    assert len(kept_a) > 0 and kept_a[IDS].values.tolist() == kept_b[IDS].values.tolist()
    for x, y in zip(kept_a.tensor, kept_b.tensor):
        np.testing.assert_allclose(np.asarray(y, float), np.asarray(x, float), rtol=1e-4, atol=1e-6)


@pytest.mark.compiled
def test_a_compiled_model_observes_and_edits_outputs_as_the_eager_one(tmp_path):
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(2)]
    loss_fn = lambda forward, x, y: F.cross_entropy(forward(x), y)  # noqa: E731
    source = run(mlp(), {"keep": {"type": "capture", "layers": "0", "kinds": ["output"]}}, batches,
                 tmp_path / "source", False, loss_fn)
    entries = {"stats": {"type": "stats", "layers": "leaf:**", "kinds": ["output"]},
               "capture": {"type": "capture", "layers": "3", "kinds": ["output"]},
               "patch": {"type": "patch", "layers": "0", "source": str(source), "index": "..., 0:4"},
               "ablate": {"type": "ablate", "layers": "1", "index": [1, 2]},
               "shift": {"type": "shift", "layers": "2", "value": 0.5},
               "edit_output": {"type": "edit_output", "layers": "2", "op": "mul", "value": 2.0}}
    eager = run(mlp(), entries, batches, tmp_path / "eager", False, loss_fn)
    compiled = run(mlp(), entries, batches, tmp_path / "compiled", True, loss_fn)
    assert_same_records(eager, compiled)


@pytest.mark.compiled
def test_compiled_gpt2_tiny_records_stats_extract_and_ablate_as_eager(tmp_path):
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 100, (2, 16), generator=gen),)]
    loss_fn = lambda forward, x: forward(input_ids=x, labels=x).loss  # noqa: E731
    entries = {"stats": {"type": "stats", "layers": "transformer.h.*", "kinds": ["output"]},
               "extract": {"type": "capture", "layers": "transformer.h.1.mlp", "kinds": ["output"]},
               "ablate": {"type": "ablate", "layers": "transformer.h.0.mlp"}}
    torch.manual_seed(0)
    eager = run(gpt2_tiny().eval(), entries, batches, tmp_path / "eager", False, loss_fn)
    torch.manual_seed(0)
    compiled = run(gpt2_tiny().eval(), entries, batches, tmp_path / "compiled", True, loss_fn,
                   model_breaks="logging.Logger method not supported")  # transformers' own logger calls
    assert_same_records(eager, compiled)


@pytest.mark.compiled
def test_the_compiled_benchmark_runs_and_counts_graph_breaks(tmp_path):
    from benchmarks import compiled

    result = compiled.main(["--quick", "--out", str(tmp_path)])
    assert result["bare_graph_breaks"] == 0 and result["stats_graph_breaks"] == 0  # the stats hooks trace
    assert result["graph_breaks_per_entry"] == {"stats": 0, "extract": 0, "ablate": 0}  # each entry on its own
    assert result["stats_over_bare"] > 0 and (tmp_path / "compiled.json").is_file()


@pytest.mark.compiled
def test_the_readme_compile_example_records_in_the_compiled_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = mlp()
    code = docs_block("how-to/big-models.md", "Big models", "python", 1) + "    fast(torch.randn(4, 8))\n    run.step()\n"
    exec(code, {"runner": runner, "torch": torch, "model": model})
    stats = analysis.load_stats(tmp_path / "runs" / "attach")
    assert sorted(stats.layer) == ["0", "1", "2", "3"] and set(stats.kind) == {"output"}


@pytest.mark.compiled
def test_compile_true_records_what_eager_records_without_a_graph_break(run_with):
    """The command line's ``compile=true``: the manifest counts the graph breaks met while compiling
    (``graph_breaks``), none for entries on outputs, and the records are eager's."""
    overrides = ["model=convnet", "hooks=[stats,extract,ablate]", "hooks.stats.kinds=[output]",
                 "hooks.stats.layers=leaf:**", "hooks.extract.layers=fc", "hooks.ablate.layers=relu", "steps=2"]
    eager = run_with(*overrides)
    compiled = run_with(*overrides, "compile=true")
    assert json.loads((compiled / "manifest.json").read_text())["graph_breaks"] == 0
    assert "graph_breaks" not in json.loads((eager / "manifest.json").read_text())
    assert_same_records(eager, compiled)


@pytest.mark.compiled
def test_a_print_entry_s_graph_breaks_are_counted(run_with):
    """``print`` calls Python's ``print`` in its hook, which the graph cannot hold: counted, not hidden."""
    compiled = run_with("model=convnet", "hooks=print", "hooks.print.layers=fc", "compile=true", "loss=none")
    assert json.loads((compiled / "manifest.json").read_text())["graph_breaks"] > 0


@pytest.mark.compiled
def test_a_budget_is_checked_at_a_compiled_first_call_as_at_an_eager_one(tmp_path):
    """With ``memory={"budget": ...}`` the first call's rehearsal runs outside the graph (one break there):
    the refusal names the eager rehearsal's bytes, and under the budget the records are eager's."""
    x = torch.randn(4, 8)
    entries = {"keep": {"type": "capture", "layers": "0", "kinds": ["output"]}}
    lines = []
    for compiled in (False, True):
        torch.compiler.reset()
        model = mlp()
        with pytest.raises(ConfigError) as refused:
            with runner.attach(model, hooks=entries, out_dir=tmp_path / f"refused-{compiled}", memory={"budget": "100B"}):
                (torch.compile(model) if compiled else model)(x)
        lines.append(str(refused.value))
        assert not (tmp_path / f"refused-{compiled}" / "tensors.parquet").exists()
    assert lines[0] == lines[1] and "hooks.keep 256 B of kept tensors of one step" in lines[0]  # 4 x 16 float32
    outs = []
    for compiled in (False, True):
        torch.compiler.reset()
        model = mlp()
        with runner.attach(model, hooks=entries, out_dir=tmp_path / f"ran-{compiled}", memory={"budget": "1KiB"}) as rec:
            (torch.compile(model) if compiled else model)(x).sum().backward()
            rec.step()
        outs.append(tmp_path / f"ran-{compiled}")
    assert_same_records(*outs)


@pytest.mark.compiled
@pytest.mark.parametrize("preset", ["stats", "extract", "ablate"])
def test_resnet18_compiles_each_preset_into_one_graph_without_a_break(tmp_path, preset):
    """The README's "no graph break" at a real model's size: resnet18's activations are large enough
    to take the float32 sums of ``eager_reductions``, whose overflow check (a Python ``bool`` of a
    tensor) broke the graph once per recorded layer before compiled hooks summed in float64."""
    import torchvision
    from benchmarks.compiled import ENTRIES

    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(), torch.randn(2, 3, 64, 64)
    with runner.attach(model, hooks=[preset], overrides=ENTRIES[preset], out_dir=tmp_path / "run") as session:
        fast = torch.compile(model)
        counters.clear()
        loss = F.log_softmax(fast(x), dim=1).mean()
        session.backward(loss)
        session.step(loss)
        breaks, graphs = dict(counters["graph_break"]), counters["stats"]["unique_graphs"]
    assert breaks == {} and graphs == 1
