"""``mode=generate`` against a hand-written ``model.generate``: the tokens generated under steering, an SAE
feature edit, a patch from a stored generation run, no hook at all, and sampling with a seed equal those of
``model.generate`` on the same tiny GPT-2 with the same forward hooks registered by hand, token for token; ``runner.attach`` around the
user's own ``generate`` records every call; bad input is one line with status 2 and nothing written.

The model is gpt2_tiny's architecture with larger random weights (``initializer_range=0.2``), saved with
``save_pretrained`` beside the tiny tokenizer (``model=hf``): gpt2_tiny's own weights (0.02) make it
repeat its last token whatever came before, so an edit applied to the prompt only, or to the new tokens
only, would generate what the edit at every call does, and the tests could not tell them apart."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

import runner
from common.errors import ConfigError
from conftest import make_config, run, run_main
from runner.engine.plan import compile_plan
from runner.analysis import load_stats
from runner.sources.models import gpt2_tiny
from test_sae import FIXTURES, hand_spliced

TOKENIZER = str(FIXTURES / "tiny_tokenizer")
PROMPTS = ["the cat sees the", "a dog", "king and queen love"]
LAYER = "transformer.h.0"
NEW = 6
TEXT = ("data=text", f"data.prompts=[{','.join(PROMPTS)}]", "mode=generate", "loss=none",
        f"generate.max_new_tokens={NEW}")


def gpt2():
    """The tests' model (the module's docstring says why not gpt2_tiny's own weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                      initializer_range=0.2, bos_token_id=0, eos_token_id=0)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """``gpt2()`` and the tiny tokenizer saved together with ``save_pretrained``: a ``model=hf`` folder."""
    folder = tmp_path_factory.mktemp("hf") / "gpt2_lively"
    gpt2().save_pretrained(folder)
    AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True).save_pretrained(folder)
    return folder


@pytest.fixture
def text(saved) -> tuple[str, ...]:
    """A generation run's overrides: the saved model, its folder's tokenizer, the prompts."""
    return ("model=hf", f"model.path={saved}", *TEXT)


def by_hand(model, hook=None, layer: str = LAYER, seed: int | None = None, prompts: list[str] = PROMPTS,
            **kwargs) -> list[list[int]]:
    """``model.generate`` on the left-padded ``prompts``, with ``hook`` on ``layer`` registered by hand: each
    prompt's new tokens up to its first end-of-text token (id 0)."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    handle = model.get_submodule(layer).register_forward_hook(hook) if hook else None
    if seed is not None:
        torch.manual_seed(seed)
    try:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=NEW, pad_token_id=0, **kwargs)
    finally:
        if handle:
            handle.remove()
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    return [row[:row.index(0) + 1] if 0 in row else row for row in rows]


def generated(run_dir: Path) -> list[list[int]]:
    table = pd.read_parquet(run_dir / "generations.parquet").sort_values("sample")
    assert table["prompt"].tolist() == PROMPTS
    return [list(ids) for ids in table["generated_ids"]]


def add(scale: float, vector: torch.Tensor):
    return lambda module, args, output: output + scale * vector.to(output.dtype)


@pytest.fixture
def vector(tmp_path) -> tuple[str, torch.Tensor]:
    values = np.random.default_rng(3).standard_normal(32)
    np.save(tmp_path / "v.npy", values)
    return str(tmp_path / "v.npy"), torch.from_numpy(values)


@pytest.mark.parametrize("use_cache", [True, False])
def test_steered_generation_equals_generate_with_the_hook_by_hand_token_for_token(tmp_path, vector, use_cache,
                                                                                text):
    path, values = vector
    overrides = (*text, "hooks=steer", f"hooks.steer.layers={LAYER}", f"hooks.steer.file={path}",
                 "hooks.steer.baseline=false", "hooks.steer.scale=1", f"generate.use_cache={use_cache}")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    steered = by_hand(gpt2(), add(1.0, values), do_sample=False)
    assert generated(out) == steered
    assert steered != by_hand(gpt2(), do_sample=False)  # the steering changed what was generated
    calls = load_stats(out).query("kind == 'patched' or kind == 'output'")["call"]
    assert calls.nunique() == max(map(len, steered))  # the hook ran at every generated token's call


def test_without_hooks_the_run_generates_what_plain_generate_does_and_names_the_prompts(tmp_path, text):
    out = run(make_config(*text), tmp_path / "run", text)
    plain = by_hand(gpt2(), do_sample=False)
    assert generated(out) == plain
    table = pd.read_parquet(out / "generations.parquet").sort_values("sample")
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    assert table["generated_text"].tolist() == [tokenizer.decode(ids, skip_special_tokens=True) for ids in plain]
    assert [list(ids) for ids in table["prompt_ids"]] == [tokenizer(p)["input_ids"] for p in PROMPTS]


def test_sampled_generation_with_a_seed_is_reproducible_and_equals_generate_by_hand(tmp_path, text):
    sampled = (*text, "generate.do_sample=true", "generate.seed=7", "generate.temperature=2.0")
    first = generated(run(make_config(*sampled), tmp_path / "a", sampled))
    assert generated(run(make_config(*sampled), tmp_path / "b", sampled)) == first
    assert first == by_hand(gpt2(), seed=7, do_sample=True, temperature=2.0, top_k=0)
    other = (*text, "generate.do_sample=true", "generate.seed=8", "generate.temperature=2.0")
    assert generated(run(make_config(*other), tmp_path / "c", other)) != first


def test_batches_of_prompts_each_sampled_from_seed_plus_step(tmp_path, text):
    overrides = (*text, "data.batch_size=2", "generate.do_sample=true", "generate.seed=3")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    table = pd.read_parquet(out / "generations.parquet")
    assert table["step"].tolist() == [0, 0, 1] and table["sample"].tolist() == [0, 1, 2]  # one epoch by default
    model, tokenizer = gpt2(), AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    ids = tokenizer(PROMPTS[2], return_tensors="pt")
    torch.manual_seed(3 + 1)
    with torch.no_grad():
        last = model.generate(**ids, max_new_tokens=NEW, pad_token_id=0, do_sample=True, top_k=0)
    row = last[0, ids["input_ids"].shape[1]:].tolist()
    assert list(table["generated_ids"].iloc[2]) == (row[:row.index(0) + 1] if 0 in row else row)


def test_an_sae_feature_edit_during_generation_equals_the_hand_written_splice(tmp_path, text):
    overrides = (*text, "hooks=sae", f"hooks.sae.path={FIXTURES / 'sae_standard'}", "hooks.sae.features=[0,5]",
                 "hooks.sae.op=steer", "hooks.sae.value=1.0")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    spliced = by_hand(gpt2(), hand_spliced({LAYER: ([0, 5], 1.0)})[LAYER], do_sample=False)
    assert generated(out) == spliced
    assert spliced != by_hand(gpt2(), do_sample=False)


def test_a_patch_from_a_stored_generation_run_equals_a_hand_written_patch_at_every_call(tmp_path, text):
    """Catches a patch that copies from the wrong position, the wrong call or the wrong sample, or acts only at the
    prompt's call: patching the last position of a block's output (``index: ':, -1'``) with a stored generation
    run's, from other prompts, generates what ``model.generate`` does with hand-written hooks: one keeping the
    block's output at each call on the source prompts, one writing each call's last position into the other
    prompts' pass. The patch changes what they generate, and a stored forward pass is refused before the run."""
    others = list(reversed(PROMPTS))
    stored = (*text, "hooks=extract", f"hooks.extract.layers={LAYER}")
    source = run(make_config(*stored), tmp_path / "source", stored)
    patched = (*text, f"data.prompts=[{','.join(others)}]", "hooks=patch", f"hooks.patch.layers={LAYER}",
               f"hooks.patch.source={source}", "hooks.patch.index=':, -1'")
    out = run(make_config(*patched), tmp_path / "patched", patched)
    table = pd.read_parquet(out / "generations.parquet").sort_values("sample")
    assert table["prompt"].tolist() == others

    kept = []
    by_hand(gpt2(), lambda module, args, output: kept.append(output.detach().clone()), do_sample=False)
    calls = iter(kept)

    def last_position_from_source(module, args, output):
        output = output.clone()
        output[:, -1] = next(calls)[:, -1]
        return output

    expected = by_hand(gpt2(), last_position_from_source, prompts=others, do_sample=False)
    assert next(calls, None) is None  # the patched pass made as many calls as the source's
    assert [list(ids) for ids in table["generated_ids"]] == expected
    assert expected != by_hand(gpt2(), prompts=others, do_sample=False)  # the patch changed what was generated
    assert expected != generated(source)  # and it is not the source's text: the other prompts still count
    forward = tuple(o.replace("mode=generate", "mode=eval") for o in stored)
    eval_source = run(make_config(*forward), tmp_path / "forward", forward)
    with pytest.raises(ConfigError, match=r"hooks.patch.source: run .* is a forward pass \(mode=eval\)"):
        compile_plan(make_config(*text, "hooks=patch", f"hooks.patch.layers={LAYER}",
                                 f"hooks.patch.source={eval_source}"))


def test_attach_around_the_user_s_own_generate_records_every_call_and_steers_it(tmp_path, vector):
    path, values = vector
    model = gpt2()
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    entries = {"steer": {"type": "steer", "layers": LAYER, "file": path, "scale": 1.0, "baseline": False},
               "stats": {"type": "stats", "layers": LAYER, "kinds": ["output"]}}
    with runner.attach(model, hooks=entries, out_dir=tmp_path / "run") as attached:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=NEW, pad_token_id=0, do_sample=False, use_cache=True)
        attached.step()
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    assert [row[:row.index(0) + 1] if 0 in row else row for row in rows] == by_hand(gpt2(), add(1.0, values))
    recorded = load_stats(tmp_path / "run").query("hook == 'stats'")
    assert sorted(recorded["call"]) == list(range(NEW))  # the prompt's call, then one per new token
    assert recorded.set_index("call")["tensor_shape"].map(list).to_dict() == {
        0: [3, 4, 32], **{k: [3, 1, 32] for k in range(1, NEW)}}


def test_text_samples_are_named_by_their_prompt_in_unit_inputs(tmp_path):
    """``data.tokenizer`` given, ``model=gpt2_tiny``: a forward pass over the prompts (``mode=eval``)."""
    overrides = ("model=gpt2_tiny", "data=text", f"data.prompts=[{','.join(PROMPTS)}]", f"data.tokenizer={TOKENIZER}",
                 "mode=eval", "loss=none", "hooks=units", f"hooks.units.layers={LAYER}")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    inputs = pd.read_parquet(out / "unit_inputs.parquet").sort_values("sample")
    assert dict(zip(inputs["sample"], inputs["input_name"])) == dict(enumerate(PROMPTS))


def test_right_padded_prompts_give_each_prompt_s_own_logits_in_a_forward_pass(tmp_path):
    """Pads on the right: a causal model's outputs at a prompt's own tokens are those of the prompt alone."""
    overrides = ("model=gpt2_tiny", "data=text", f"data.prompts=[{','.join(PROMPTS)}]",
                 f"data.tokenizer={TOKENIZER}", "mode=eval", "loss=none")
    batch = next(compile_plan(make_config(*overrides)).data.batches(0, torch.device("cpu")))
    torch.manual_seed(0)
    model, tokenizer = gpt2_tiny().eval(), AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    with torch.no_grad():
        together = model(batch.x).logits
        for i, prompt in enumerate(PROMPTS):
            alone = model(torch.tensor([tokenizer(prompt)["input_ids"]])).logits[0]
            torch.testing.assert_close(together[i, :len(alone)], alone, atol=1e-5, rtol=0)


def test_gpt2_tiny_generates_what_plain_generate_does_with_the_tokenizer_given(tmp_path):
    overrides = ("model=gpt2_tiny", f"data.tokenizer={TOKENIZER}", *TEXT)
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    torch.manual_seed(0)  # the run's seed: the same random weights
    assert generated(out) == by_hand(gpt2_tiny().eval(), do_sample=False)


#: case: (the overrides of ``TEXT`` left out, by their start; the overrides added; the one line expected)
BAD = {
    "not a causal LM": (("model=", "data.tokenizer"), ("model=hf", "model.path=M", "model.auto=model"),
                        "mode=generate: the model (GPT2Model) cannot generate text"),
    "a vision model": (("model=",), ("model=resnet18",), "mode=generate: model resnet18 takes no token ids"),
    # the run's defaults (data=randn, epochs of it) are not what it is told: the model is the cause
    "a vision model on the default data": (("model=", "data", "loss"), ("model=resnet18",),
                                           "mode=generate: model resnet18 takes no token ids (model.input_kind=tensor), "
                                           "so it cannot generate text; generation needs a causal language model and "
                                           "data=text: model=hf model.auto=causal_lm, or model=gpt2_tiny"),
    "no tokenizer": (("data",), ("data=tokens", "data.size=4"), "mode=generate: data=tokens has no tokenizer"),
    "missing folder": ((), ("data.tokenizer=/nonexistent/tok",), "data.tokenizer: no folder at '/nonexistent/tok'"),
    "no prompts": ((), ("data.prompts=[]",), "data.prompts: data=text needs prompts"),
    "steer baseline": ((), ("hooks=steer", "hooks.steer.file=V", f"hooks.steer.layers={LAYER}"),
                       "hooks.steer: 'steer' runs a pass beside each step, which mode=generate does not run; "
                       "set hooks.steer.baseline=false"),
    "patch from a clean pass": ((), ("hooks=patch", "hooks.patch.source=clean", f"hooks.patch.layers={LAYER}"),
                                "hooks.patch: 'patch' runs a pass beside each step, which mode=generate does not run; "
                                "patch from a stored run (hooks.patch.source=RUN_DIR)"),
    "no new tokens": ((), ("generate.max_new_tokens=0",), "generate.max_new_tokens: 0 must be at least 1"),
    "an entry named generate": ((), ("+hooks.generate.type=stats", f"+hooks.generate.layers={LAYER}"),
                                "hooks.generate: in mode=generate the name 'generate' is the generation's own"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_with_status_2_and_nothing_written(case, tmp_path, monkeypatch, capsys, vector, saved):
    dropped, extra, message = BAD[case]
    extra = tuple(e.replace("=V", f"={vector[0]}").replace("=M", f"={saved}") for e in extra)
    base = tuple(o for o in ("model=gpt2_tiny", f"data.tokenizer={TOKENIZER}", *TEXT)
                 if not (dropped and o.startswith(dropped)))
    out = tmp_path / "out"
    ran = run_main(monkeypatch, capsys, *base, *extra, f"hydra.run.dir={out}")
    assert ran.code == 2, ran
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


def test_the_gate_names_a_vision_model_before_the_data_it_makes_fail():
    """A config made without the command line (``runner.attach``, a test) meets the same first answer."""
    with pytest.raises(ConfigError, match=r"^mode=generate: model resnet18 takes no token ids"):
        compile_plan(make_config("mode=generate", "model=resnet18"))


def test_a_requeued_generation_run_keeps_the_rows_of_the_steps_it_ran(tmp_path, text, monkeypatch):
    """``generations.parquet`` is written at the end: a job requeued in step 2 brings back steps 0 and 1's rows
    with its resume point, and its table equals an uninterrupted run's."""
    import json

    from runner.engine.generation import Generation

    overrides = (*text, "data.batch_size=1", "generate.do_sample=true")
    whole = pd.read_parquet(run(make_config(*overrides), tmp_path / "whole", overrides) / "generations.parquet")
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real = Generation.step

    def requeued(self, model, batch, step):
        if step == 2:
            raise SystemExit(-1)  # what submitit's handler does after requeueing the job
        return real(self, model, batch, step)

    monkeypatch.setattr(Generation, "step", requeued)
    with pytest.raises(SystemExit):
        run(make_config(*overrides), tmp_path / "requeued", overrides)
    monkeypatch.setattr(Generation, "step", real)
    out = run(make_config(*overrides), tmp_path / "requeued", overrides)
    assert json.loads((out / "manifest.json").read_text())["resumed_at_step"] == 2
    resumed = pd.read_parquet(out / "generations.parquet")
    assert resumed["step"].tolist() == [0, 1, 2]
    pd.testing.assert_frame_equal(resumed, whole)


def test_an_index_on_the_last_position_steers_the_newest_token_of_every_call(tmp_path, vector, text):
    """With the cache each call after the prompt's sees one position: ``index: ':, -1'`` is the prompt's last
    token in call 0 and the new token in every later call, as a hand-written hook on ``output[:, -1]``."""
    path, values = vector
    overrides = (*text, "hooks=steer", f"hooks.steer.layers={LAYER}", f"hooks.steer.file={path}",
                 "hooks.steer.baseline=false", "hooks.steer.scale=1", "hooks.steer.index=':, -1'")
    out = run(make_config(*overrides), tmp_path / "run", overrides)

    def last(module, args, output):
        output = output.clone()
        output[:, -1] += values.to(output.dtype)
        return output

    assert generated(out) == by_hand(gpt2(), last, do_sample=False, use_cache=True)
    assert generated(out) != by_hand(gpt2(), add(1.0, values), do_sample=False)  # not every position's
