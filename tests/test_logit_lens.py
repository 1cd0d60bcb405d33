"""``logit_lens`` against plain PyTorch on gpt2_tiny: each block's output put through ``ln_f`` and then
``lm_head`` by hand gives the recorded top tokens, target logits, probabilities and ranks; a model without
a final norm and unembedding, or a layer of another width, is one line with status 2."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import cli, make_config, run
from runner.analysis.lens import load_lens
from runner.engine.plan import compile_plan
from runner.sources.models import gpt2_tiny

GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2")


def by_hand(overrides: tuple[str, ...]) -> list[dict[int, torch.Tensor]]:
    """Per step, per block, ``lm_head(ln_f(block output))`` in float64, from a model and batches made as the run made them."""
    torch.manual_seed(0)
    model = gpt2_tiny().eval()
    batches = compile_plan(make_config(*overrides)).data.batches(0, torch.device("cpu"))
    out = []
    for _ in range(2):
        x = next(batches).x
        seen = {}
        handles = [block.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o))
                   for i, block in enumerate(model.transformer.h)]
        with torch.no_grad():
            final = model(x).logits
            lens = {i: model.lm_head(model.transformer.ln_f(h)).double() for i, h in seen.items()}
        for handle in handles:
            handle.remove()
        torch.testing.assert_close(lens[len(lens) - 1], final.double(), rtol=0, atol=0)  # the last block is the model's output
        out.append({"x": x, **lens})
    return out


@pytest.mark.parametrize("target", ["final", "next", 7])
def test_lens_rows_are_each_block_output_through_ln_f_and_lm_head_by_hand(tmp_path, target):
    overrides = (*GPT2, "hooks=logit_lens", "hooks.logit_lens.top_k=4", f"hooks.logit_lens.target={target}")
    rows = load_lens(run(make_config(*overrides), tmp_path / "run", overrides))
    hand = by_hand(overrides)
    assert len(rows) == 2 * 2 * 2 * 16  # steps x blocks x samples x positions
    for row in rows.itertuples():
        logits = hand[row.step][row.block][row.sample % 2, row.position]
        assert row.layer == f"transformer.h.{row.block}"
        top = logits.topk(4)
        assert list(row.top_ids) == top.indices.tolist()
        np.testing.assert_allclose(row.top_logits, top.values.numpy(), rtol=1e-6)
        tokens = hand[row.step]["x"][row.sample % 2]
        final = hand[row.step][1][row.sample % 2, row.position].argmax()  # the last block's is the model's output
        want = {"final": int(final), "next": int(tokens[row.position + 1]) if row.position < 15 else -1}.get(target, 7)
        assert row.target == want
        if want < 0:
            assert np.isnan(row.target_logit) and np.isnan(row.target_prob) and row.target_rank == -1
            continue
        assert row.target_logit == pytest.approx(float(logits[want]), rel=1e-6)
        assert row.target_prob == pytest.approx(float(logits.softmax(-1)[want]), rel=1e-6)
        assert row.target_rank == int((logits > logits[want]).sum())


@pytest.mark.parametrize("bad, message", [
    (("model=mlp", "data=randn"), "error: hooks.logit_lens: MLP has no unembedding (get_output_embeddings()); "
                                  "the logit lens reads a causal language model; valid: model=gpt2_tiny, "
                                  "model=hf model.auto=causal_lm"),
    (("model=gpt2_tiny", "data=tokens", "hooks.logit_lens.layers=transformer.h.0.mlp.c_fc"),
     "error: hooks.logit_lens.layers: 'transformer.h.0.mlp.c_fc' outputs [2, 16, 128]; the lens reads block outputs "
     "[batch, positions, 32] (the unembedding's width)"),
    (("model=gpt2_tiny", "data=tokens", "hooks.logit_lens.target=100"),
     "error: hooks.logit_lens.target: 100 is not a token of a vocabulary of 100"),
])
def test_a_model_or_layer_the_lens_cannot_read_is_one_line_with_status_2(tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as exit_:
        cli(["hooks=logit_lens", "loss=none", *bad], tmp_path / "out")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_saved_causal_lm_is_read_and_the_same_model_without_its_head_is_refused(tmp_path, capsys):
    torch.manual_seed(0)
    gpt2_tiny().save_pretrained(tmp_path / "gpt2")
    common = ("model=hf", f"model.path={tmp_path / 'gpt2'}", "data=tokens", "loss=none", "mode=eval", "hooks=logit_lens")
    rows = load_lens(run(make_config(*common, "model.auto=causal_lm"), tmp_path / "causal"))
    assert set(rows.layer) == {"transformer.h.0", "transformer.h.1"} and (rows[rows.block == 1].target_rank == 0).all()
    capsys.readouterr()  # save_pretrained's progress bar
    with pytest.raises(SystemExit) as exit_:
        cli([*common[:-1], "model.auto=model", "hooks=logit_lens", "hooks.logit_lens.layers=h.*"], tmp_path / "base")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: hooks.logit_lens: GPT2Model has no unembedding (get_output_embeddings()); the logit lens reads a "
        "causal language model; valid: model=gpt2_tiny, model=hf model.auto=causal_lm"]


def test_plan_true_names_the_lens_s_pytorch_hooks():
    from runner.engine.plan import describe

    text = describe(compile_plan(make_config("model=gpt2_tiny", "data=tokens", "loss=none", "hooks=[logit_lens,units]",
                                             "hooks.units.layers=transformer.h.0")))
    assert ("hooks.logit_lens (type logit_lens): register_forward_hook (block outputs) + register_forward_pre_hook and "
            "register_forward_hook (the model's input tokens and output logits)") in text
    assert "hooks.units (type units): register_forward_hook (output)" in text
