"""``data=digits`` and ``model=digits_cnn``: real labelled data offline, and the ``accuracy`` column."""
from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from common.errors import ConfigError
from common.records import STEP_METRICS
import runner
import runner.analysis as analysis
from conftest import make_config
from runner.engine.plan import compile_plan
from runner.engine.train import EVAL_SEED_OFFSET
from runner.sources.models import DigitsCNN

DIGITS = ("model=digits_cnn", "data=digits", "loss=cross_entropy", "optimizer=sgd", "optimizer.lr=0.1",
          "eval_every=25", "progress=false")


def _rows(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.reshape(len(x), -1)}


def test_digits_are_sklearns_split_into_a_seeded_train_part_and_a_held_out_part():
    source = compile_plan(make_config(*DIGITS)).data
    digits = load_digits()
    every = torch.tensor(digits.images, dtype=torch.float32).reshape(-1, 64) / 16.0
    held = next(source.batches(EVAL_SEED_OFFSET, torch.device("cpu"), held_out=True))
    assert held.x.shape == (359, 1, 8, 8) and held.x.min() >= 0 and held.x.max() <= 1
    stream = source.batches(0, torch.device("cpu"))
    epochs = [[next(stream) for _ in range(1438 // 64)] for _ in range(2)]
    first = torch.cat([b.x for b in epochs[0]])
    assert all(b.x.shape == (64, 1, 8, 8) for b in epochs[0])
    assert not _rows(first) & _rows(held.x)  # no held-out digit is trained on
    assert (_rows(first) | _rows(held.x)) <= _rows(every)
    labels = {row.numpy().tobytes(): int(t) for row, t in zip(every, digits.target)}
    assert [labels[r.numpy().tobytes()] for r in held.x.reshape(-1, 64)] == held.targets.tolist()
    assert not torch.equal(epochs[0][0].x, epochs[1][0].x)  # a new order each epoch
    again = next(source.batches(0, torch.device("cpu")))
    assert torch.equal(again.x, epochs[0][0].x)  # from the seed
    other_split = compile_plan(make_config(*DIGITS, "data.split_seed=1")).data
    assert not torch.equal(next(other_split.batches(0, torch.device("cpu"), held_out=True)).x, held.x)


def test_digits_cnn_learns_the_held_out_digits_and_steps_report_accuracy(run_with):
    """The CLI's losses and accuracies equal a plain PyTorch loop's; held-out accuracy is well above chance."""
    run_dir = run_with(*DIGITS, "steps=100")
    steps = analysis.load_steps(run_dir)
    plan = compile_plan(make_config(*DIGITS, "steps=100"))
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = plan.data.batches(0, torch.device("cpu"))
    held = next(plan.data.batches(EVAL_SEED_OFFSET, torch.device("cpu"), held_out=True))
    train, evals = [], []
    for step in range(100):
        batch = next(batches)
        opt.zero_grad(set_to_none=True)
        out = model(batch.x)
        loss = F.cross_entropy(out, batch.targets)
        train.append((loss.item(), (out.argmax(1) == batch.targets).float().mean().item()))
        loss.backward()
        opt.step()
        if (step + 1) % 25 == 0:
            with torch.no_grad():
                out = model.eval()(held.x)
                model.train()
            evals.append((F.cross_entropy(out, held.targets).item(), (out.argmax(1) == held.targets).float().mean().item()))
    got_train = steps[steps.split == "train"]
    got_eval = steps[steps.split == "eval"]
    np.testing.assert_allclose(got_train[["loss", "accuracy"]].to_numpy(), train, rtol=1e-5)
    np.testing.assert_allclose(got_eval[["loss", "accuracy"]].to_numpy(), evals, rtol=1e-5)
    assert got_eval.accuracy.iloc[-1] > 0.5  # chance is 0.1


def test_accuracy_is_a_column_only_of_a_run_that_classifies_and_a_sweep_of_both_loads(run_with, tmp_path):
    summed = run_with("model=convnet", "loss=sum", "steps=2")
    classified = run_with("model=convnet", "loss=cross_entropy", "optimizer=sgd", "steps=2")
    plain = analysis.load_steps(summed)
    assert len(plain) == 2 and "accuracy" not in plain.columns
    assert not [c for c in STEP_METRICS if c in pq.read_schema(summed / "steps.parquet").names]
    assert pq.read_schema(classified / "steps.parquet").names[-1:] == ["accuracy"]
    accuracy = analysis.load_steps(classified).accuracy
    assert len(accuracy) == 2 and accuracy.between(0, 1).all()
    both = analysis.load_steps(tmp_path).set_index("run_dir")  # the two runs as one sweep
    assert both.loc[str(summed)].accuracy.isna().all()
    np.testing.assert_array_equal(both.loc[str(classified)].accuracy.to_numpy(), accuracy.to_numpy())


def test_a_plain_loop_reports_its_own_accuracy(tmp_path):
    model = DigitsCNN()
    with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "mine") as rec:
        loss = model(torch.zeros(2, 1, 8, 8)).sum()
        rec.backward(loss)
        rec.step(loss, accuracy=0.75)
        rec.step()
    steps = analysis.load_steps(tmp_path / "mine")
    assert steps.accuracy.iloc[0] == 0.75 and math.isnan(steps.accuracy.iloc[1])
    assert math.isnan(steps.loss.iloc[1])


@pytest.mark.parametrize("override, message", [
    ("data.held_out=1.5", "data.held_out: 1.5 must be a fraction between 0 and 1"),
    ("data.batch_size=0", "data.batch_size: 0 must be between 1 and the 1438 training digits"),
    ("data.shape=[2,1,8,8]", "data.shape: data=digits is [batch_size, 1, 8, 8]"),
    ("+data.batchsize=8", "did you mean 'batch_size'?"),
])
def test_digits_config_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        compile_plan(make_config(*DIGITS, override))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1
