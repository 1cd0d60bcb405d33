"""Seams of the gate found from outside, each a test that failed before it was closed: a user's own token
dataset feeding a Hugging Face model from the command line (``model=hf data=dataset``), the documented
remedy named when ``compile=true`` refuses an entry, an override without a key as one line, a ``custom``
replacement of another shape and what only the built model can say (``stop_after``, a model with
nothing to train) refused before Hydra writes anything."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from conftest import make_config, stats_of
from common.errors import ConfigError
from runner.cli.commandline import check_command_line
from runner.engine.plan import compile_plan
from test_own_model import gpt2_dir  # noqa: F401  (the fixture: a random-weight GPT-2 saved with save_pretrained)
from docs_text import section

pytestmark = pytest.mark.statistics

DEVICES = section("how-to/big-models.md", "Devices, memory and compilation")


def token_ids(n: int = 6, length: int = 16, vocab: int = 100) -> TensorDataset:
    """``n`` seeded sequences of token ids in ``[0, vocab)``, unlabelled: a user's own token dataset."""
    return TensorDataset(torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(5)))


def test_a_users_token_dataset_feeds_a_hugging_face_model_from_the_command_line(run_with, gpt2_dir):
    import transformers

    run_dir = run_with("model=hf", f"model.path={gpt2_dir}", "data=dataset", "data._target_=test_gate_seams.token_ids",
                       "data.batch_size=2", "mode=eval", "epochs=1", "loss=none", "hooks=stats",
                       "hooks.stats.layers=lm_head", "hooks.stats.kinds=[output]")
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True).eval()
    ids = token_ids().tensors[0]
    rows = stats_of(run_dir, hook="stats").sort_values("step")
    assert rows.step.tolist() == [0, 1, 2]  # the 6 sequences in order, 2 a step
    with torch.no_grad():
        for row in rows.itertuples():
            logits = model(ids[2 * row.step:2 * row.step + 2]).logits
            assert row.l2 == pytest.approx(logits.double().norm().item(), rel=1e-5)


def test_a_dataset_of_floats_for_a_token_model_is_one_line(gpt2_dir):
    with pytest.raises(ConfigError) as err:
        compile_plan(make_config("model=hf", f"model.path={gpt2_dir}", "data=dataset", "data.batch_size=2",
                                 "data._target_=datasets_for_tests.Squares"))
    assert str(err.value) == ("data: this model takes token ids (integers), but data=dataset gives torch.float32 "
                              "[2, 100]; use data=tokens, or data=dataset whose items are integer ids")


def test_compile_names_the_remedy_the_readme_documents():
    shown = re.search(r"\$ python -m runner (model=convnet hooks=stats compile=true)\n  error: (.*)\n", DEVICES)
    checked = check_command_line(shown.group(1).split())
    assert checked.problems == [shown.group(2)]
    assert shown.group(2).endswith("record the forward pass only (hooks.stats.kinds=[output]), use compile=false "
                                   "or drop the entry")
    assert compile_plan(make_config("model=convnet", "hooks=stats", "compile=true", "hooks.stats.kinds=[output]"))


def test_an_edit_of_gradients_is_offered_no_kinds_that_would_not_help():
    with pytest.raises(ConfigError) as err:
        compile_plan(make_config("model=convnet", "hooks=clip", "hooks.clip.target=output", "compile=true"))
    assert "kinds=" not in str(err.value) and str(err.value).endswith("use compile=false or drop the entry")


@pytest.mark.parametrize("override, message", [
    ("=1", "'=1': no key before '='; write KEY=VALUE, e.g. steps=1"),
    ("+=x", "'+=x': no key before '='; write KEY=VALUE, e.g. steps=1"),
    ("model=1", "model: unknown preset '1'; valid: "),
    ("hooks=[clip,2]", "hooks: unknown preset '2'; valid: "),
    ("model=null", "model: unknown preset 'null'; valid: "),
    ("hydra/launcher=1", "hydra/launcher: 1 is not a preset name"),
])
def test_an_override_hydra_cannot_take_is_one_line(override, message):
    checked = check_command_line(["model=linear", override])
    assert len(checked.problems) == 1 and checked.problems[0].startswith(message), checked.problems


def widen(module, args, output):
    return torch.cat([output, output], dim=-1)


def widen_grad(grad):
    return torch.cat([grad, grad], dim=-1)


def widen_input(module, args):
    return torch.cat([args[0], args[0]], dim=-1)


def total(module, args, output):
    print(output.sum().item())  # needs values: the rehearsal leaves it to the real run


MLP = ["model=mlp", "data.shape=[2,100]"]


def refused(argv: list[str], out: Path, monkeypatch, capsys) -> list[str]:
    """``python -m runner ARGV hydra.run.dir=OUT`` in this process: it must exit with status 2 and leave no
    ``OUT`` (no ``.hydra/``: Hydra never started); what it printed on stderr."""
    import runner.__main__ as runner_main

    monkeypatch.setattr(sys, "argv", ["runner", *argv, f"hydra.run.dir={out}"])
    with pytest.raises(SystemExit) as exit_:
        runner_main.main()
    assert exit_.value.code == 2 and not out.exists()
    return capsys.readouterr().err.splitlines()


def custom(hook: str, fn: str, *more: str) -> str:
    return f"+hooks.c={{type:custom,layers:fc1,hook:{hook},fn:test_gate_seams.{fn}{''.join(',' + m for m in more)}}}"


@pytest.mark.parametrize("entry, message", [
    (custom("forward", "widen"), "hooks.c: test_gate_seams.widen changed the output of 'fc1' from 0: [2, 200] to "
                                 "0: [2, 400]; a forward hook must keep the shapes PyTorch gives it"),
    (custom("tensor", "widen_grad"), "hooks.c: test_gate_seams.widen_grad changed the grad_output of 'fc1' from "
                                     "0: [2, 200] to 0: [2, 400]; a tensor hook must keep the shapes PyTorch gives it"),
    (custom("tensor", "widen_grad", "target:params", "params:[bias]"),
     "hooks.c: test_gate_seams.widen_grad changed the param_grad of 'fc1' from bias: [200] to bias: [400]; "
     "a tensor hook must keep the shapes PyTorch gives it"),
    (custom("forward_pre", "widen_input"), "hooks.c: test_gate_seams.widen_input changed the input of 'fc1' from "
                                           "0: [2, 100] to 0: [2, 200], and the pass then failed: "),
])
def test_a_custom_replacement_of_another_shape_is_one_line_before_hydra_writes_anything(entry, message, monkeypatch,
                                                                                        capsys, tmp_path):
    errors = refused([*MLP, entry], tmp_path / "run", monkeypatch, capsys)
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), errors


def test_a_fn_that_needs_values_is_left_to_the_real_run(run_with, capsys):
    run_dir = run_with(*MLP, "loss=none", custom("forward", "total"))
    printed = capsys.readouterr().out.split()
    assert len(printed) == 1 and float(printed[0]) == pytest.approx(stats_of(run_dir, hook="c").iloc[0]["mean"] * 400,
                                                                     rel=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["model=mlp", "data.shape=[2,100]", "loss=none", "stop_after=conv9"],
     "stop_after: unknown module 'conv9'; valid: fc1, fc2, relu"),
    (["model=digits_cnn", "data=digits", "loss=none", "hooks=units", "hooks.units.layers=[conv1]", "stop_after=auto"],
     "stop_after: auto needs a model that is a sequence of modules (nn.Sequential), not a DigitsCNN; "
     "name the module, e.g. stop_after=layer2"),
    (["model=custom", "model._target_=torch.nn.ReLU", "model.input_shape=[2,3]", "optimizer=sgd"],
     "optimizer: 'sgd' but the model has no trainable parameters"),
])
def test_what_only_the_model_can_say_is_refused_before_hydra_writes_anything(argv, message, monkeypatch, capsys,
                                                                             tmp_path):
    assert refused(argv, tmp_path / "run", monkeypatch, capsys) == [f"error: {message}"]


def test_a_loggers_unknown_key_is_named_as_every_schema_names_one(tmp_path):
    """One schema merge (``common.schema_merge``) for entries, sources and loggers: the valid keys and the closest."""
    import runner

    with pytest.raises(ConfigError) as err:
        with runner.attach(torch.nn.Linear(3, 3), hooks=["stats"], logger={"tensorboard": {"everyy": 3}},
                           out_dir=tmp_path / "run"):
            pass
    assert str(err.value) == ("logger.tensorboard.everyy: unknown key of logger 'tensorboard' 'everyy'; valid: "
                              "close_timeout_s, dir, entries, every, histograms, queue, stats; did you mean 'every'?")
    assert not (tmp_path / "run").exists()


def test_a_bad_kernel_switch_is_one_line_before_hydra_writes_anything(monkeypatch, capsys, tmp_path):
    """``HOOK_RUNNER_NATIVE`` is read by every statistic; its value is checked by the gate (``_check_settings``)."""
    monkeypatch.setenv("HOOK_RUNNER_NATIVE", "off")
    assert refused([*MLP, "hooks=stats"], tmp_path / "run", monkeypatch, capsys) == [
        "error: HOOK_RUNNER_NATIVE='off': valid: 1 (the C statistics kernels, the default) or 0 (eager PyTorch "
        "reductions)"]
