"""A whole-dataset pass (``mode=eval`` over data with a length), its shards, and ``stop_after``."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from conftest import make_config, run
from common.errors import ConfigError
from models_for_tests import SequentialDigits
from runner.analysis import load_steps
from runner.analysis.units import load_units
from runner.engine import whole_pass
from runner.engine.plan import compile_plan

pytestmark = pytest.mark.statistics

DIGITS = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "progress=false")
SEQUENTIAL = ("model=custom", "model._target_=models_for_tests.SequentialDigits", "model.head=5", "data=digits",
              "mode=eval", "epochs=1", "progress=false")


def every_digit() -> torch.Tensor:
    return torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16.0


def test_an_eval_pass_reads_every_digit_once_in_index_order_with_its_sample_id():
    plan = compile_plan(make_config(*DIGITS))
    assert plan.settings.steps == 29  # 28 batches of 64 and one of 5: the held-out part included, none dropped
    batches = [next(b) for b in [whole_pass.batches(plan.data, 0, torch.device("cpu"))] for _ in range(29)]
    assert torch.equal(torch.cat([b.x for b in batches]), every_digit())
    assert torch.equal(torch.cat([b.samples for b in batches]), torch.arange(1797))
    assert torch.equal(torch.cat([b.targets for b in batches]), torch.tensor(load_digits().target))


def test_a_dataset_pass_computes_no_gradient_unless_asked(tmp_path):
    SequentialDigits.instances.clear()
    out = run(make_config(*SEQUENTIAL, "loss=cross_entropy"), tmp_path / "run")
    (model,) = SequentialDigits.instances
    assert model[-1].calls == [False] * 29 and all(p.grad is None for p in model.parameters())
    logits = torch.cat([model(x) for x in every_digit().split(64)]).detach()
    target = torch.tensor(load_digits().target)
    expected = [float(F.cross_entropy(logits[i:i + 64], target[i:i + 64])) for i in range(0, 1797, 64)]
    np.testing.assert_allclose(load_steps(out).loss, expected, rtol=1e-6)
    SequentialDigits.instances.clear()
    trained = [o for o in SEQUENTIAL if o != "epochs=1"]
    run(make_config(*trained, "loss=cross_entropy", "optimizer=sgd", "steps=2"), tmp_path / "trained")
    assert SequentialDigits.instances[0][-1].calls == [True, True]  # an optimizer asks for gradients


def test_shards_are_contiguous_parts_whose_sample_ids_stay_global():
    seen = []
    for shard in range(3):
        plan = compile_plan(make_config(*DIGITS, f"data.shard={shard}", "data.num_shards=3"))
        stream = whole_pass.batches(plan.data, 0, torch.device("cpu"))
        seen.append(torch.cat([next(stream).samples for _ in range(plan.settings.steps)]))
        assert plan.settings.steps == 10  # 599 digits a shard: 9 batches of 64 and one of 23
    assert torch.equal(torch.cat(seen), torch.arange(1797))


def test_token_sets_are_datasets_with_a_length():
    pytest.importorskip("transformers")
    plan = compile_plan(make_config("model=gpt2_tiny", "data=tokens", "data.size=7", "mode=eval", "epochs=1"))
    assert plan.settings.steps == 4  # batches of 2: the last holds one sequence
    stream = whole_pass.batches(plan.data, 0, torch.device("cpu"))
    got = [next(stream) for _ in range(4)]
    expected = torch.randint(0, 100, (7, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.cat([b.x for b in got]), expected)
    assert torch.equal(torch.cat([b.samples for b in got]), torch.arange(7))


@pytest.mark.parametrize("stop", ["auto", "2"])
def test_stop_after_ends_the_forward_there_and_changes_no_statistic(tmp_path, stop):
    units = ("hooks=units", "hooks.units.layers=[0,2]", "loss=none")
    whole = load_units(run(make_config(*SEQUENTIAL, *units), tmp_path / "whole"))
    SequentialDigits.instances.clear()
    stopped = load_units(run(make_config(*SEQUENTIAL, *units, f"stop_after={stop}"), tmp_path / "stopped"))
    (model,) = SequentialDigits.instances
    assert model[-1].calls == []  # nothing after conv 2 ran
    for column in ("count", "mean", "m2", "min", "max", "above"):
        assert np.array_equal(whole[column], stopped[column]), column


@pytest.mark.parametrize("overrides, message", [
    (("stop_after=2", "loss=sum"), "stop_after: 2 ends the forward early but loss=sum needs the model's output"),
    (("stop_after=2", "loss=none", "metric.target=3"), "stop_after: 2 ends the forward early but metric needs"),
])
def test_a_stop_the_run_cannot_afford_is_refused_before_it(overrides, message):
    with pytest.raises(ConfigError) as info:
        compile_plan(make_config(*SEQUENTIAL, "hooks=units", "hooks.units.layers=[0]", *overrides))
    assert message in str(info.value)


def test_stop_after_auto_needs_a_sequence_of_modules(tmp_path):
    with pytest.raises(ConfigError, match="stop_after: auto needs a model that is a sequence of modules"):
        run(make_config(*DIGITS, "hooks=units", "hooks.units.layers=[conv1]", "loss=none", "stop_after=auto"),
            tmp_path / "run")
    assert not (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.slow  # two fresh processes for the peak-memory table
def test_quick_units_benchmark_writes_every_table(tmp_path):
    from benchmarks import units as bench

    out = bench.main(["--quick", "--out", str(tmp_path)])
    text = (out / "units.md").read_text()
    for table in ("Per-unit statistics and early stop", "Activation store", "Peak memory of a store pass"):
        assert table in text
    import pyarrow.parquet as pq

    names = set(pq.read_table(out / "units.parquet").column("name").to_pylist())
    assert names == {"units", "stop_after=layer2", "store write", "store read", "peak RSS"}


def test_units_in_your_own_loop_number_samples_in_the_order_seen(tmp_path):
    import runner

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    xs = torch.randn(5, 2, 4)
    with runner.attach(model, hooks={"u": {"type": "units", "layers": "0", "top_k": 2}}, out_dir=tmp_path / "run") as r:
        for x in xs:
            model(x)
            r.step()
    units = load_units(tmp_path / "run")
    out = torch.cat([model(x) for x in xs]).detach().double().numpy()
    np.testing.assert_allclose(units["mean"], out.mean(0), rtol=1e-9)
    for unit in range(3):
        assert list(units.top_sample[unit]) == list(np.argsort(-out[:, unit], kind="stable")[:2])
