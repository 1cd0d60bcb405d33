"""``runner.integrations.lightning.HookCallback``: a real ``lightning.Trainer`` writes the tables a plain loop writes."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.statistics

lightning = pytest.importorskip("lightning")  # the `lightning` extra, part of the `test` extra

from common.errors import ConfigError
import runner
import runner.analysis as analysis
from conftest import assert_no_partial_output, docs_code, hook_count
from runner.integrations.lightning import HookCallback
from runner.store.outputs import STATS_SCHEMA

HOOKS, OVERRIDES = ["clip", "stats"], ["hooks.clip.max=0.001"]
LR = 0.5


class Classifier(lightning.LightningModule):
    """Two linear layers; logs its batch accuracy as ``accuracy``."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.relu, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)
        self.fail_at = fail_at

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("user's bug")
        x, y = batch
        out = self(x)
        self.log("accuracy", (out.argmax(1) == y).float().mean(), on_step=True, on_epoch=False)
        return F.cross_entropy(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 8, generator=g), torch.randint(0, 3, (24,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=6)  # 4 steps, in order


def fit(module, callback) -> None:
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(module, loader())


def test_a_lightning_fit_writes_the_tables_of_the_same_plain_loop(tmp_path):
    module = Classifier()
    fit(module, HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "pl"))
    assert hook_count(module) == 0

    plain = Classifier()
    opt = torch.optim.SGD(plain.parameters(), lr=LR)
    with runner.attach(plain, hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "plain") as run:
        for x, y in loader():
            opt.zero_grad()
            out = plain(x)
            loss = F.cross_entropy(out, y)
            run.backward(loss)
            opt.step()
            run.step(loss, accuracy=(out.argmax(1) == y).float().mean().item())

    mine, theirs = analysis.load_stats(tmp_path / "pl"), analysis.load_stats(tmp_path / "plain")
    assert len(mine) == len(theirs) > 0 and set(mine.phase) == {"forward", "backward", "after_backward"}
    pd.testing.assert_frame_equal(mine[STATS_SCHEMA.names], theirs[STATS_SCHEMA.names])
    drop = ["wall_time_s", "peak_memory_bytes", "run_dir"]
    steps_pl, steps_plain = analysis.load_steps(tmp_path / "pl"), analysis.load_steps(tmp_path / "plain")
    pd.testing.assert_frame_equal(steps_pl.drop(columns=drop), steps_plain.drop(columns=drop))
    assert list(steps_pl.step) == [0, 1, 2, 3] and steps_pl.accuracy.notna().all()


def test_the_clip_entry_acts_on_what_lightning_trains(tmp_path):
    """Hand-written: the same four SGD steps with every gradient clamped to [-0.01, 0.001]."""
    module = Classifier()
    fit(module, HookCallback(hooks=["clip"], overrides=OVERRIDES, out_dir=tmp_path / "pl"))
    plain = Classifier()
    opt = torch.optim.SGD(plain.parameters(), lr=LR)
    for x, y in loader():
        opt.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        for p in plain.parameters():
            p.grad.clamp_(-0.01, 0.001)
        opt.step()
    for a, b in zip(module.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)
    stats = analysis.load_stats(tmp_path / "pl")
    grads = stats[stats.kind == "param_grad"]  # beside them: what the clamp removed (kind clipped)
    assert len(grads) and (grads["max"] <= 0.001 * (1 + 1e-7)).all() and set(stats.kind) == {"param_grad", "clipped"}


def test_an_exception_in_training_removes_the_hooks_and_writes_nothing_final(tmp_path):
    module = Classifier(fail_at=2)
    with pytest.raises(RuntimeError, match="user's bug"):
        fit(module, HookCallback(hooks=HOOKS, out_dir=tmp_path / "pl"))
    assert hook_count(module) == 0
    assert_no_partial_output(tmp_path / "pl")


@pytest.mark.parametrize("kwargs, message", [
    ({"hooks": ["clp"]}, "did you mean 'clip'"),
    ({"hooks": ["stats"], "accuracy": "acc"}, "HookCallback(accuracy=...): unknown logged metric 'acc'"),
])
def test_a_mistake_is_one_line_and_leaves_nothing(tmp_path, kwargs, message):
    module = Classifier()
    with pytest.raises(ConfigError) as err:
        fit(module, HookCallback(out_dir=tmp_path / "pl", **kwargs))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, err.value
    assert hook_count(module) == 0
    assert_no_partial_output(tmp_path / "pl")


def test_validation_inside_fit_is_recorded_as_eval_passes_of_the_step_before(tmp_path):
    """Validation after steps 1 and 3 (4 batches each, plus Lightning's sanity check before training):
    phase ``eval`` rows numbered per validation, ``split=eval`` rows with the logged ``val_loss``, and
    training steps whose rows stay those of a fit without validation."""
    seen: list[torch.Tensor] = []

    class Validated(Classifier):
        def validation_step(self, batch, batch_idx):
            out = self(batch[0])
            if not self.trainer.sanity_checking:
                seen.append(out.detach().clone())
            loss = F.cross_entropy(out, batch[1])
            self.log("val_loss", loss)
            return loss

    module = Validated()
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, val_check_interval=2,
                                callbacks=[HookCallback(hooks=["stats"], out_dir=tmp_path / "pl")])
    trainer.fit(module, loader(), loader())
    stats = analysis.load_stats(tmp_path / "pl")
    train = stats[stats.phase != "eval"]
    assert sorted(set(train.step)) == [0, 1, 2, 3] and (train.call == 0).all()
    assert len(train) == 4 * 3 * 2  # 4 steps x 3 layers x (output, grad_output)
    fc2 = stats[(stats.phase == "eval") & (stats.layer == "fc2")].sort_values(["step", "call"])
    assert list(fc2.step) == [1] * 4 + [3] * 4 and list(fc2.call) == [0, 1, 2, 3] * 2
    assert len(seen) == 8
    for row, out in zip(fc2.itertuples(), seen):
        assert row.mean == pytest.approx(out.double().mean().item(), rel=1e-6)
        assert row.max == out.max().item()
    steps = analysis.load_steps(tmp_path / "pl")
    evals = steps[steps.split == "eval"]
    assert list(evals.step) == [1, 3] and evals.loss.notna().all() and evals.loss.iloc[0] != evals.loss.iloc[1]


def test_the_readme_lightning_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = docs_code("how-to/integrations.md", "Lightning and Hugging Face", "**Lightning**")
    exec(compile(code, "docs/how-to/integrations.md (Lightning)", "exec"), {})
    steps = analysis.load_steps(tmp_path / "runs" / "lightning")
    assert len(steps) == 29 and steps.accuracy.between(0, 1).all()  # 1,797 digits in batches of 64, one epoch
    stats = analysis.load_stats(tmp_path / "runs" / "lightning")
    grads = stats[stats.kind == "param_grad"]
    assert len(grads) and (grads["max"] <= 0.1 * (1 + 1e-7)).all() and set(grads.layer) >= {"net.conv1", "net.fc"}
