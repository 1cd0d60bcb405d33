"""``runner.integrations.huggingface.HookCallback``: a real ``transformers.Trainer`` writes the tables a plain loop writes."""
from __future__ import annotations

import gc

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.statistics

transformers = pytest.importorskip("transformers")  # the `transformers` extra, part of the `test` extra

from common.errors import ConfigError
import runner
import runner.analysis as analysis
from conftest import assert_no_partial_output, docs_code, hook_count
from runner.integrations.huggingface import HookCallback
from runner.store.outputs import STATS_SCHEMA

HOOKS, OVERRIDES = ["clip", "stats"], ["hooks.clip.max=0.001", "hooks.stats.layers=re:transformer\\.h\\.0\\..*"]
LR, STEPS, BATCH = 0.5, 3, 2


def tiny_gpt2() -> torch.nn.Module:
    """A one-block GPT-2 built from a config (no download), without dropout, so both runs compute the same."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, use_cache=False,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def samples() -> list[dict]:
    tokens = torch.randint(0, 50, (STEPS * BATCH, 8), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": t, "labels": t} for t in tokens]


def train(model, callback, tmp_path, eval_dataset=None, **args) -> None:
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf-trainer"), use_cpu=True, max_steps=STEPS,
        per_device_train_batch_size=BATCH, train_sampling_strategy="sequential", lr_scheduler_type="constant",
        save_strategy="no", disable_tqdm=True, **{"max_grad_norm": 0.0, "report_to": [], **args})
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    transformers.Trainer(model=model, args=arguments, train_dataset=samples(), eval_dataset=eval_dataset,
                         callbacks=[callback], optimizers=(optimizer, None)).train()


def test_a_trainer_run_writes_the_tables_of_the_same_plain_loop(tmp_path):
    model = tiny_gpt2()
    with HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "hf") as callback:
        train(model, callback, tmp_path)
    assert hook_count(model) == 0

    plain = tiny_gpt2()
    opt = torch.optim.SGD(plain.parameters(), lr=LR)
    data = samples()
    with runner.attach(plain, hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "plain") as run:
        for i in range(STEPS):
            x = torch.stack([s["input_ids"] for s in data[i * BATCH:(i + 1) * BATCH]])
            # the Trainer divides the summed token losses by its count of labels, taken before the shift
            loss = plain(input_ids=x, labels=x, num_items_in_batch=torch.tensor(x.numel())).loss
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss)

    mine, theirs = analysis.load_stats(tmp_path / "hf"), analysis.load_stats(tmp_path / "plain")
    assert len(mine) == len(theirs) > 0 and set(mine.phase) == {"forward", "backward", "after_backward"}
    pd.testing.assert_frame_equal(mine[STATS_SCHEMA.names], theirs[STATS_SCHEMA.names])
    steps_hf, steps_plain = analysis.load_steps(tmp_path / "hf"), analysis.load_steps(tmp_path / "plain")
    assert list(steps_hf.step) == list(range(STEPS))
    pd.testing.assert_series_equal(steps_hf.loss, steps_plain.loss)
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)


class Failing(transformers.TrainerCallback):
    """A user's callback with a bug that shows at the second step."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("user's bug")


def short_arguments(tmp_path) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, report_to=[], max_steps=STEPS,
                                          per_device_train_batch_size=BATCH, save_strategy="no", disable_tqdm=True)


def test_an_exception_in_training_removes_the_hooks_and_writes_nothing_final(tmp_path):
    model = tiny_gpt2()

    with pytest.raises(RuntimeError, match="user's bug"):
        with HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "hf") as callback:
            transformers.Trainer(model=model, args=short_arguments(tmp_path), train_dataset=samples(),
                                 callbacks=[callback, Failing()]).train()
    assert hook_count(model) == 0
    assert_no_partial_output(tmp_path / "hf")


def test_a_callback_passed_without_with_commits_at_train_end_as_the_with_block_does(tmp_path):
    model = tiny_gpt2()
    train(model, HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "plain"), tmp_path)
    assert hook_count(model) == 0
    with HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "with") as callback:
        train(tiny_gpt2(), callback, tmp_path)
    mine, theirs = analysis.load_stats(tmp_path / "plain"), analysis.load_stats(tmp_path / "with")
    assert len(mine) > 0
    pd.testing.assert_frame_equal(mine[STATS_SCHEMA.names], theirs[STATS_SCHEMA.names])


def test_an_exception_without_with_removes_the_hooks_and_writes_nothing_final(tmp_path):
    model = tiny_gpt2()

    arguments = short_arguments(tmp_path)
    with pytest.raises(RuntimeError, match="user's bug"):
        transformers.Trainer(model=model, args=arguments, train_dataset=samples(),
                             callbacks=[HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "hf"),
                                        Failing()]).train()
    gc.collect()  # the Trainer and its callbacks are gone with the exception: the finalizer has run
    assert hook_count(model) == 0
    assert_no_partial_output(tmp_path / "hf")


def test_the_next_train_removes_the_hooks_a_failed_one_left(tmp_path):
    model = tiny_gpt2()
    callback = HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=tmp_path / "hf")

    class FailingOnce(transformers.TrainerCallback):
        failed = False

        def on_step_end(self, args, state, control, **kwargs):
            if not FailingOnce.failed:
                FailingOnce.failed = True
                raise RuntimeError("user's bug")

    arguments = short_arguments(tmp_path)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=samples(),
                                   callbacks=[callback, FailingOnce()])
    with pytest.raises(RuntimeError, match="user's bug"):
        trainer.train()
    assert hook_count(model) > 0 and not (tmp_path / "hf" / "manifest.json").exists()  # the callback is alive
    trainer.train()
    assert hook_count(model) == 0 and (tmp_path / "hf" / "manifest.json").exists()
    assert list(analysis.load_steps(tmp_path / "hf").step) == list(range(STEPS))


@pytest.mark.parametrize("inside, args, message", [
    (True, {"gradient_checkpointing": True}, "HookCallback: activation (gradient) checkpointing is not supported"),
    (True, {"hooks": ["clp"]}, "did you mean 'clip'"),
])
def test_a_mistake_is_one_line_and_leaves_nothing(tmp_path, inside, args, message):
    model = tiny_gpt2()
    hooks = args.pop("hooks", HOOKS)
    callback = HookCallback(hooks=hooks, out_dir=tmp_path / "hf")
    with pytest.raises(ConfigError) as err:
        if inside:
            with callback:
                train(model, callback, tmp_path, **args)
        else:
            train(model, callback, tmp_path, **args)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, err.value
    checkpointing = args.get("gradient_checkpointing", False)  # then the Trainer left a hook of its own
    assert hook_count(model) == (1 if checkpointing else 0) and callback.recording.run is None
    assert_no_partial_output(tmp_path / "hf")


def test_after_backward_is_recorded_after_the_trainers_clipping_and_evaluation_is_not_recorded(tmp_path):
    model = tiny_gpt2()
    with HookCallback(hooks=["clip", "stats"], out_dir=tmp_path / "hf",
                      overrides=["hooks.clip.max=1.0", "hooks.clip.min=-1.0", "hooks.stats.layers=transformer.h.0.mlp"]
                      ) as callback:
        train(model, callback, tmp_path, eval_dataset=samples()[:2], max_grad_norm=1e-3, eval_strategy="steps",
              eval_steps=1)
    grads = analysis.load_stats(tmp_path / "hf")
    after = grads[grads.phase == "after_backward"]
    for step, rows in after.groupby("step"):
        assert np.sqrt((rows.l2.astype(float) ** 2).sum()) == pytest.approx(1e-3, rel=1e-3)  # the total norm, clipped
    assert sorted(set(after.step)) == list(range(STEPS)) and set(grads.layer) > {"transformer.h.0.mlp"}
    assert (grads.call == 0).all()  # evaluated after each step: recorded, it would add calls 1.. to the next step


def test_the_readme_trainer_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = docs_code("how-to/integrations.md", "Lightning and Hugging Face", "**Hugging Face `Trainer`**")
    exec(compile(code, "docs/how-to/integrations.md (Trainer)", "exec"), {})
    steps = analysis.load_steps(tmp_path / "runs" / "hf")
    assert list(steps.step) == list(range(20)) and steps.loss.notna().all()
    stats = analysis.load_stats(tmp_path / "runs" / "hf")
    assert set(stats.layer) == {"transformer.h.0.mlp", "transformer.h.1.mlp"}


def test_a_callback_event_without_a_model_is_one_line(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, report_to=[])
    with pytest.raises(ConfigError, match=r"^HookCallback: the Trainer passed model=NoneType, not a torch.nn.Module$"):
        with HookCallback(hooks=HOOKS, out_dir=tmp_path / "hf") as callback:
            callback.on_train_begin(args, transformers.TrainerState(), transformers.TrainerControl())
    assert not (tmp_path / "hf").exists()
