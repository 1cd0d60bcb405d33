"""``dla`` (direct logit attribution) against plain PyTorch and TransformerLens 4 on a saved gpt2_tiny whose
biases and final-norm weights are random (so the constant term and the frozen scale both matter): the
parts sum to the logit difference of the model's own logits; each head, ``attn_bias`` and a block left out
(the ``rest``) equal a float64 attribution by hand-written hooks (``hand_dla``: heads rebuilt from the attention
pattern); and every contribution equals TransformerLens's ``logit_attrs`` of ``decompose_resid`` /
``stack_head_results``."""
from __future__ import annotations

import shlex

import pandas as pd
import pytest
import torch

from common.records import DLA, DLA_WHOLE
from conftest import cli, make_config, run, run_main
from docs_text import blocks, section
from runner.analysis.load import load_table
from runner.engine.plan import compile_plan
from runner.sources.models import gpt2_tiny

DIFF = (3, 7)
#: An entry adding 1 to a module's output, after ``dla`` read its parts.
BUMP = "+hooks.bump={{type:edit_output,layers:{},op:add,value:1.0}}"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """gpt2_tiny saved with ``save_pretrained``, every bias and LayerNorm weight drawn at random."""
    path = tmp_path_factory.mktemp("gpt2_dla")
    torch.manual_seed(0)
    model = gpt2_tiny()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                parameter.add_(0.3 * torch.randn_like(parameter))
    model.save_pretrained(path)
    return path


def overrides(gpt2_dir, *more: str) -> tuple[str, ...]:
    return ("model=hf", f"model.path={gpt2_dir}", "model.auto=causal_lm", "data=tokens", "loss=none", "mode=eval",
            "steps=1", "hooks=dla", f"hooks.dla.diff=[{DIFF[0]},{DIFF[1]}]", *more)


def dla_rows(gpt2_dir, tmp_path, *more: str) -> pd.DataFrame:
    chosen = overrides(gpt2_dir, *more)
    return load_table(run(make_config(*chosen), tmp_path / "run", chosen), DLA)


def by_hand(gpt2_dir, *more: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's batch and plain PyTorch's ``logit[a] - logit[b]`` of the saved model at every position, in float64."""
    x, logits, _ = saved_model_pass(gpt2_dir, *more)
    return x, logits[..., DIFF[0]] - logits[..., DIFF[1]]


def saved_model_pass(gpt2_dir, *more: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The run's batch, the saved model's float64 logits on it, and what hand-written hooks read there: each
    module's output (by name), the final norm's and each ``ln_1``'s input, each block's attention pattern."""
    from transformers import AutoModelForCausalLM

    x = next(compile_plan(make_config(*overrides(gpt2_dir, *more))).data.batches(0, torch.device("cpu"))).x
    model = AutoModelForCausalLM.from_pretrained(gpt2_dir, attn_implementation="eager").eval().double()
    model.requires_grad_(False)
    read = {"model": model}
    handles = [model.get_submodule(name).register_forward_hook(
        lambda m, args, out, name=name: read.update({name: out[0] if isinstance(out, tuple) else out}))
        for name in ("transformer.wte", "transformer.wpe", *[f"transformer.h.{b}.{part}" for b in (0, 1)
                                                             for part in ("attn", "mlp")])]
    handles += [model.get_submodule(name).register_forward_pre_hook(
        lambda m, args, name=name: read.update({f"{name} input": args[0]}))
        for name in ("transformer.ln_f", "transformer.h.0.ln_1", "transformer.h.1.ln_1")]
    with torch.no_grad():
        out = model(x, output_attentions=True)
    for handle in handles:
        handle.remove()
    read["pattern"] = out.attentions  # per block [batch, heads, query, key]
    return x, out.logits, read


def hand_dla(gpt2_dir) -> dict[tuple[str, int, int], torch.Tensor]:
    """Direct logit attribution in float64 by hand, ``[batch, positions]`` per ``(component, block, head)``:
    ``((c - mean c) / s) . (gamma * (W_U[a] - W_U[b]))`` with ``s`` the final norm's scale on the whole residual
    stream (TransformerLens's ``apply_ln_to_stack``). A head's output is built from its attention pattern and
    its value vectors (``ln_1``'s normalized input times the head's value weights, then its rows of the output
    projection); what every value vector holds whatever the input (the values' bias and ``ln_1``'s bias through
    the value weights) goes with the output projection's bias into ``attn_bias``, as TransformerLens folds it."""
    _, _, read = saved_model_pass(gpt2_dir)
    model = read["model"]
    resid = read["transformer.ln_f input"]
    scale = (resid.var(-1, unbiased=False) + model.transformer.ln_f.eps).sqrt()
    unembed = model.lm_head.weight
    direction = model.transformer.ln_f.weight * (unembed[DIFF[0]] - unembed[DIFF[1]])

    def attributed(c: torch.Tensor) -> torch.Tensor:
        return ((c - c.mean(-1, keepdim=True)) / scale[..., None]) @ direction

    found = {("embed", -1, -1): attributed(read["transformer.wte"]),
             ("pos_embed", -1, -1): attributed(read["transformer.wpe"].expand_as(resid))}
    width = resid.shape[-1]
    for b in (0, 1):
        block = model.transformer.h[b]
        found[("attn", b, -1)] = attributed(read[f"transformer.h.{b}.attn"])
        found[("mlp", b, -1)] = attributed(read[f"transformer.h.{b}.mlp"])
        inp = read[f"transformer.h.{b}.ln_1 input"]
        normed = (inp - inp.mean(-1, keepdim=True)) / (inp.var(-1, unbiased=False, keepdim=True) + block.ln_1.eps).sqrt()
        w_v, b_v = block.attn.c_attn.weight[:, 2 * width:], block.attn.c_attn.bias[2 * width:]
        values = (normed * block.ln_1.weight) @ w_v  # [batch, positions, heads * head_dim], without the constant
        heads = block.attn.num_heads
        head_dim = width // heads
        w_o = block.attn.c_proj.weight.reshape(heads, head_dim, width)
        for h in range(heads):
            per_head = values[..., h * head_dim:(h + 1) * head_dim]
            found[("head", b, h)] = attributed(read["pattern"][b][:, h] @ per_head @ w_o[h])
        constant = (block.ln_1.bias @ w_v + b_v) @ block.attn.c_proj.weight + block.attn.c_proj.bias
        found[("attn_bias", b, -1)] = attributed(constant.expand_as(resid))
    return found


def ours(rows: pd.DataFrame, component: str, block: int, head: int = -1) -> torch.Tensor:
    """The run's contributions of one part, ``[samples, positions read]``."""
    part = rows[(rows.component == component) & (rows.block == block) & (rows["head"] == head)]
    positions = part.position.nunique()
    return torch.tensor(part.sort_values(["sample", "position"]).contribution.to_numpy()).reshape(-1, positions)


def test_the_parts_sum_to_the_model_s_logit_difference_at_every_position(gpt2_dir, tmp_path):
    rows = dla_rows(gpt2_dir, tmp_path, "hooks.dla.position=null")
    _, diff = by_hand(gpt2_dir)
    whole = rows[rows.component.isin(DLA_WHOLE)]
    assert sorted(set(whole.component)) == sorted(DLA_WHOLE) and len(rows) == 2 * 16 * 14  # samples x positions x parts
    total = whole.groupby(["sample", "position"]).contribution.sum()
    want = pd.Series({(s, p): float(diff[s, p]) for s in range(2) for p in range(16)})
    pd.testing.assert_series_equal(total, want.reindex(total.index), check_names=False, rtol=0, atol=1e-5)
    pd.testing.assert_series_equal(rows.groupby(["sample", "position"]).logit_diff.first(), want.reindex(total.index),
                                   check_names=False, rtol=0, atol=1e-5)
    assert (rows[rows.component == "rest"].contribution.abs() < 1e-6).all()  # every block selected: nothing left
    assert (rows[rows.component == "bias"].contribution.abs() > 1e-3).all()  # the random ln_f bias is there


def test_each_head_and_attention_bias_equal_a_hand_written_attribution_from_the_attention_pattern(gpt2_dir, tmp_path):
    """Catches heads swapped, a head's slice of the output projection misread, or the value constant counted in the
    heads rather than in ``attn_bias`` (each still sums to ``attn``, which the hook checks itself): every head's
    and ``attn_bias``'s contribution at the last position equals ``hand_dla``'s, which builds each head's output
    from HF's attention pattern and the value vectors, not from the output projection's input."""
    rows = dla_rows(gpt2_dir, tmp_path)
    assert set(rows.position) == {15}  # position -1: the last, as metric.diff reads it
    expected = hand_dla(gpt2_dir)
    assert sorted(rows[rows.component == "head"]["head"].unique()) == [0, 1]
    for block in (0, 1):
        for component, head in [("head", 0), ("head", 1), ("attn_bias", -1), ("attn", -1)]:
            want = expected[(component, block, head)][:, -1:]
            assert want.abs().min() > 1e-4, (component, block, head)  # 1000 times the tolerance: a real check
            torch.testing.assert_close(ours(rows, component, block, head), want, rtol=0, atol=1e-7,
                                       msg=f"{component} block {block} head {head}")
    assert (expected[("head", 0, 0)] - expected[("head", 0, 1)])[:, -1].abs().min() > 1e-4  # swapped heads differ


def test_a_block_left_out_is_the_rest(gpt2_dir, tmp_path):
    """Catches a ``rest`` that is zero or leaves a part out: selecting only ``transformer.h.1``, ``rest`` is block
    0's attention and MLP outputs attributed by hand (float64 hooks on the saved model), and every other part
    is ``hand_dla``'s."""
    one = dla_rows(gpt2_dir, tmp_path / "one", "hooks.dla.layers=transformer.h.1")
    expected = hand_dla(gpt2_dir)
    rest = expected[("attn", 0, -1)] + expected[("mlp", 0, -1)]
    assert rest[:, -1].abs().min() > 1e-3
    torch.testing.assert_close(ours(one, "rest", -1), rest[:, -1:], rtol=0, atol=1e-6)
    for component, block in [("embed", -1), ("pos_embed", -1), ("attn", 1), ("mlp", 1)]:
        torch.testing.assert_close(ours(one, component, block), expected[(component, block, -1)][:, -1:], rtol=0,
                                   atol=1e-6, msg=component)
    assert set(one.layer) == {"", "transformer.h.1"}


@pytest.mark.parametrize("bad, message", [
    (("model=mlp", "data=randn", "hooks.dla.diff=[1,2]"),
     "error: hooks.dla: MLP has no unembedding (get_output_embeddings()); direct logit attribution reads a causal language "
     "model; valid: model=gpt2_tiny, model=hf model.auto=causal_lm"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,2]", "hooks.dla.layers=transformer.h.0.mlp"),
     "error: hooks.dla.layers: 'transformer.h.0.mlp' is not one of the model's blocks; select blocks, "
     "e.g. hooks.dla.layers=blocks.*"),
    (("model=gpt2_tiny", "data=tokens"),
     "error: hooks.dla.diff: [] must be two token ids [a, b]: the logit difference logit[a] - logit[b], "
     "e.g. 'hooks.dla.diff=[3,7]'"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,100]"),
     "error: hooks.dla.diff: [1, 100] are not tokens of a vocabulary of 100"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,2]", "hooks.dla.position=16"),
     "error: hooks.dla.position: 16 is not a position of 'transformer.h.0' output's 16 (-1: the last; null: every "
     "position)"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,2]", "mode=train", "loss=sum"),
     "error: hooks.dla: the model's dropout is on in training mode, and dropped parts do not add up to the logit "
     "difference; run mode=eval"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,2]", BUMP.format("transformer.h.0.attn.c_proj")),
     "error: hooks.dla: 'transformer.h.0' attention output is not its heads' outputs plus the output projection's "
     "bias: an entry edits between them; read the model unedited"),
    (("model=gpt2_tiny", "data=tokens", "hooks.dla.diff=[1,2]", BUMP.format("transformer.h.1")),
     "error: hooks.dla: the final norm's input is not the embeddings plus every block's attention and mlp outputs: "
     "an entry edits between them; read the model unedited"),
])
def test_what_dla_cannot_read_is_one_line_with_status_2(tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as exit_:
        cli(["hooks=dla", "loss=none", "mode=eval", *bad], tmp_path / "out")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.oracles
def test_every_contribution_equals_transformer_lens_logit_attrs(gpt2_dir, tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    rows = dla_rows(gpt2_dir, tmp_path, "hooks.dla.position=null")
    x, diff = by_hand(gpt2_dir)
    bridge = TransformerBridge.boot_transformers(str(gpt2_dir), device="cpu")
    bridge.enable_compatibility_mode()  # HookedTransformer's numerics: ln_f folded into W_U (the DLA convention)
    _, cache = bridge.run_with_cache(x)
    blocks, labels = cache.decompose_resid(layer=-1, mode="all", incl_embeds=True, return_labels=True)
    heads, head_labels = cache.stack_head_results(layer=-1, return_labels=True)
    theirs = {}
    for stack, names in ((blocks, labels), (heads, head_labels)):
        attrs = cache.logit_attrs(stack, tokens=DIFF[0], incorrect_tokens=DIFF[1])  # [parts, batch, positions]
        theirs.update(dict(zip(names, attrs.double())))
    constant = float(bridge.b_U[DIFF[0]] - bridge.b_U[DIFF[1]])  # ln_f's bias, folded into the unembedding's
    for label, component, block, head in [("embed", "embed", -1, -1), ("pos_embed", "pos_embed", -1, -1),
                                          *[(f"{b}_{c}_out", c, b, -1) for b in (0, 1) for c in ("attn", "mlp")],
                                          *[(f"L{b}H{h}", "head", b, h) for b in (0, 1) for h in (0, 1)]]:
        ours = rows[(rows.component == component) & (rows.block == block) & (rows["head"] == head)]
        got = torch.tensor(ours.sort_values(["sample", "position"]).contribution.to_numpy()).reshape(2, 16)
        torch.testing.assert_close(got, theirs[label], rtol=0, atol=1e-5, msg=label)
    bias = rows[rows.component == "bias"].contribution
    assert bias.sub(constant).abs().max() < 1e-5
    total = sum(theirs[label] for label in labels) + constant
    torch.testing.assert_close(total, diff, rtol=0, atol=1e-5)  # theirs, too, sums to the logit difference


def test_the_answer_names_the_largest_parts_and_that_they_sum_to_the_logit_difference(gpt2_dir, tmp_path):
    from runner.analysis.answers import answer_of

    rows = dla_rows(gpt2_dir, tmp_path)
    answer = answer_of(tmp_path / "run", "dla", "dla")
    means = rows.groupby(["component", "layer", "head"]).contribution.mean()
    def largest(parts: pd.Series) -> str:
        top = parts.iloc[parts.abs().argsort()[::-1][:5]]
        return ", ".join(f"{layer + ' ' if layer else ''}{'head ' + str(head) if component == 'head' else component} "
                         f"{value:+.4g}" for (component, layer, head), value in top.items())
    whole = means[means.index.get_level_values("component").isin(set(DLA_WHOLE) - {"bias"})]
    diff = rows.groupby("sample").logit_diff.first().mean()
    assert answer.lines[0] == f"logit[3] - logit[7] = {diff:.4g} (mean of 2 readings); largest parts: {largest(whole)}"
    assert answer.lines[1] == f"largest heads: {largest(means[means.index.get_level_values('component') == 'head'])}"
    bias = means[("bias", "", -1)]
    assert answer.lines[2].endswith(f"in every reading; the constant (bias) term is {bias:+.4g}") and abs(bias) > 1e-3
    gap = float(answer.lines[2].split(" within ")[1].split(" ")[0])
    assert gap < 1e-5


def test_the_how_to_s_command_runs_as_written_and_prints_the_answer_it_shows(tmp_path, monkeypatch, capsys):
    text = section("how-to/direct-logit-attribution.md", "Run it")
    command, = blocks(text, "bash")
    shown, = blocks(text, "text")
    monkeypatch.chdir(tmp_path)
    ran = run_main(monkeypatch, capsys, *shlex.split(command)[3:])
    assert ran.code == 0, ran.stderr
    printed = ran.stdout.splitlines()
    at = printed.index(shown.splitlines()[0])
    assert printed[at:at + 3] == shown.splitlines()
