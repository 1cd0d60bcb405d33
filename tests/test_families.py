"""Every transformer family, one vocabulary (``hooks.mechanism.families``): GPT-2, GPT-NeoX, Llama, Mistral, Qwen2, Qwen3,
Gemma2 and Gemma3 built by ``transformers`` from small configs, every weight and bias drawn at random (so biases,
norm gains and grouped key/value heads all matter), saved with ``save_pretrained`` and loaded offline with
``model=hf model.auto=causal_lm``. The presets ``hooks=dla`` and ``hooks=logit_lens`` (``layers: blocks.*``) run
unchanged on each: the lens at the last block equals the model's own logits; ``dla``'s parts sum to the model's
logit difference and equal a float64 decomposition written here with plain PyTorch hooks on each family's own
module paths (``REAL``), independent of the vocabulary's tables."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from common.records import DLA, LENS
from conftest import cli, make_config, run
from docs_text import blocks, section
from runner.analysis.load import load_table
from runner.engine.plan import compile_plan

transformers = pytest.importorskip("transformers")

PAGE = "how-to/model-families.md"
STATS = ("hooks=stats", "hooks.stats.kinds=[output]")  # forward statistics: the runs have no loss
DIFF = (3, 7)
VOCAB = 64
SMALL = dict(num_hidden_layers=2, hidden_size=16, intermediate_size=32, vocab_size=VOCAB, max_position_embeddings=64)
GQA = dict(num_attention_heads=4, num_key_value_heads=2)
#: family -> (its config, the test's own names of its parts: embedding, position embedding, block prefix,
#: attention, output projection, mlp, input norm, the attention's and MLP's output norms, final norm; how its
#: norms compute; how its value vectors sit in the value projection's output; a string: another row's parts, or Gemma's)
REAL = {
    "gpt2": (transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=64),
             dict(embed="transformer.wte", pos="transformer.wpe", block="transformer.h", attn="attn", o="c_proj",
                  mlp="mlp", ln1="ln_1", attn_norm=None, mlp_norm=None, final="transformer.ln_f", norm="ln",
                  values="fused")),
    "gpt_neox": (transformers.GPTNeoXConfig(num_attention_heads=2, **SMALL),
                 dict(embed="gpt_neox.embed_in", pos=None, block="gpt_neox.layers", attn="attention", o="dense",
                      mlp="mlp", ln1="input_layernorm", attn_norm=None, mlp_norm=None,
                      final="gpt_neox.final_layer_norm", norm="ln", values="interleaved")),
    "gpt_neox_sequential": (transformers.GPTNeoXConfig(num_attention_heads=2, use_parallel_residual=False, **SMALL),
                            "gpt_neox"),
    "llama": (transformers.LlamaConfig(attention_bias=True, mlp_bias=True, **GQA, **SMALL), None),
    "mistral": (transformers.MistralConfig(**GQA, **SMALL), None),
    "qwen2": (transformers.Qwen2Config(**GQA, **SMALL), None),
    "qwen3": (transformers.Qwen3Config(head_dim=8, **GQA, **SMALL), None),
    "gemma2": (transformers.Gemma2Config(head_dim=8, final_logit_softcapping=None, **GQA, **SMALL), "gemma"),
    "gemma3": (transformers.Gemma3TextConfig(head_dim=8, **GQA, **SMALL), "gemma"),
}
LLAMA_PARTS = dict(embed="model.embed_tokens", pos=None, block="model.layers", attn="self_attn", o="o_proj", mlp="mlp",
                   ln1="input_layernorm", attn_norm=None, mlp_norm=None, final="model.norm", norm="rms", values="grouped")
GEMMA_PARTS = {**LLAMA_PARTS, "attn_norm": "post_attention_layernorm", "mlp_norm": "post_feedforward_layernorm",
               "norm": "rms1"}


def parts_of(family: str) -> dict:
    own = REAL[family][1]
    if isinstance(own, str):  # another row's parts
        return GEMMA_PARTS if own == "gemma" else parts_of(own)
    return LLAMA_PARTS if own is None else own


def save(config, path) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family saved once: family -> its save_pretrained folder."""
    root = tmp_path_factory.mktemp("families")
    for family, (config, _) in REAL.items():
        save(config, root / family)
    return {family: root / family for family in REAL}


def overrides(folder, *more: str) -> tuple[str, ...]:
    return ("model=hf", f"model.path={folder}", "model.auto=causal_lm", "data=tokens", "loss=none", "mode=eval",
            "steps=1", *more)


def hand_pass(folder, chosen) -> tuple[torch.nn.Module, torch.Tensor, dict]:
    """The saved model in float64 on the run's batch: its logits and what plain hooks read on its own modules."""
    x = next(compile_plan(make_config(*chosen)).data.batches(0, torch.device("cpu"))).x
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval().double()
    model.requires_grad_(False)
    read, handles = {}, []

    def keep(name: str, value) -> None:  # the first call's; returns None, so nothing is replaced
        read.setdefault(name, value)

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(
            lambda m, a, out, name=name: keep(name, out[0] if isinstance(out, tuple) else out)))
        handles.append(module.register_forward_pre_hook(
            lambda m, args, name=name: keep(f"{name} input", args[0] if args else None)))
    with torch.no_grad():
        logits = model(x).logits
    for handle in handles:
        handle.remove()
    return model, logits, read


def normed(x: torch.Tensor, norm: torch.nn.Module, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x``'s linear part through a norm whose scale is frozen at ``x``'s own, and that scale."""
    if how == "ln":
        scale = (x.var(-1, unbiased=False) + norm.eps).sqrt()
        return (x - x.mean(-1, keepdim=True)) / scale[..., None] * norm.weight, scale
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    scale = (x.pow(2).mean(-1) + eps).sqrt()
    return x / scale[..., None] * (norm.weight + 1 if how == "rms1" else norm.weight), scale


def hand_dla(family: str, model, read: dict) -> dict[tuple[str, int, int], torch.Tensor]:
    """Each part's share of logit[a] - logit[b] at the last position, float64, ``[batch]`` per (component, block, head)."""
    p, config = parts_of(family), model.config
    final = model.get_submodule(p["final"])
    resid = read[f"{p['final']} input"][:, -1]
    _, scale = normed(resid, final, p["norm"])
    unembed = model.get_output_embeddings().weight
    direction = (unembed[DIFF[0]] - unembed[DIFF[1]]) * (final.weight + 1 if p["norm"] == "rms1" else final.weight)

    def share(c):
        c = c - c.mean(-1, keepdim=True) if p["norm"] == "ln" else c
        return (c / scale[..., None]) @ direction

    found = {("embed", -1, -1): share(read[p["embed"]][:, -1])}
    if p["pos"]:
        found[("pos_embed", -1, -1)] = share(read[p["pos"]][:, -1])
    heads = config.num_attention_heads
    for b in range(config.num_hidden_layers):
        prefix = f"{p['block']}.{b}"
        attn, ln1 = model.get_submodule(f"{prefix}.{p['attn']}"), model.get_submodule(f"{prefix}.{p['ln1']}")
        o = attn.get_submodule(p["o"])
        w_o = o.weight if family == "gpt2" else o.weight.T  # [in, out]: GPT-2's Conv1D holds it so
        w_o = w_o.reshape(heads, -1, w_o.shape[1])
        with torch.no_grad():  # what every value vector holds for any input: the norm of a zero input, projected
            zero = ln1(torch.zeros(1, 1, config.hidden_size, dtype=torch.float64))
            if p["values"] == "fused":
                constant = attn.c_attn(zero)[0, 0, 2 * config.hidden_size:]
            elif p["values"] == "interleaved":
                constant = attn.query_key_value(zero)[0, 0].reshape(heads, 3, -1)[:, 2].reshape(-1)
            else:
                kv = config.num_key_value_heads
                constant = attn.v_proj(zero)[0, 0].reshape(kv, -1).repeat_interleave(heads // kv, 0).reshape(-1)
        z = (read[f"{prefix}.{p['attn']}.{p['o']} input"][:, -1] - constant).reshape(-1, heads, w_o.shape[1])
        outs = torch.einsum("bhd,hdo->bho", z, w_o)
        bias = (o.bias if o.bias is not None else 0) + torch.einsum("hd,hdo->o", constant.reshape(heads, -1), w_o)
        bias = bias.expand(outs.shape[0], -1)
        attn_read, mlp_read = p["attn"], p["mlp"]
        if p["attn_norm"]:
            post = model.get_submodule(f"{prefix}.{p['attn_norm']}")
            _, post_scale = normed(read[f"{prefix}.{p['attn']}"][:, -1], post, p["norm"])
            gain = post.weight + 1
            outs, bias = outs / post_scale[:, None, None] * gain, bias / post_scale[:, None] * gain
            attn_read, mlp_read = p["attn_norm"], p["mlp_norm"]
        found[("attn", b, -1)] = share(read[f"{prefix}.{attn_read}"][:, -1])
        found[("mlp", b, -1)] = share(read[f"{prefix}.{mlp_read}"][:, -1])
        found[("attn_bias", b, -1)] = share(bias)
        for h in range(heads):
            found[("head", b, h)] = share(outs[:, h])
    lm_bias = getattr(model.get_output_embeddings(), "bias", None)
    final_bias = getattr(final, "bias", None)
    constant = (0 if final_bias is None else final_bias @ (unembed[DIFF[0]] - unembed[DIFF[1]])) + (
        0 if lm_bias is None else lm_bias[DIFF[0]] - lm_bias[DIFF[1]])
    found[("bias", -1, -1)] = torch.as_tensor(constant, dtype=torch.float64).expand_as(scale)
    return found


@pytest.mark.parametrize("family", list(REAL))
def test_presets_read_every_family_exactly(folders, tmp_path, family):
    chosen = overrides(folders[family], "hooks=[dla,logit_lens]", f"hooks.dla.diff=[{DIFF[0]},{DIFF[1]}]",
                       f"hooks.logit_lens.top_k={VOCAB}")
    run_dir = run(make_config(*chosen), tmp_path / "run", chosen)
    model, logits, read = hand_pass(folders[family], chosen)

    lens = load_table(run_dir, LENS)
    last = lens[lens.block == model.config.num_hidden_layers - 1].sort_values(["sample", "position"])
    got = torch.tensor(np.stack(last.top_logits.to_numpy()), dtype=torch.float64).reshape(logits.shape)
    torch.testing.assert_close(got, logits.sort(-1, descending=True).values, rtol=0, atol=1e-5)
    assert set(lens.canonical) == {"blocks.0", "blocks.1"}

    rows = load_table(run_dir, DLA)
    whole = rows[rows.component.isin(["embed", "pos_embed", "attn", "mlp", "rest", "bias"])]
    sums = whole.groupby("sample").contribution.sum().to_numpy()
    diff = (logits[:, -1, DIFF[0]] - logits[:, -1, DIFF[1]]).numpy()
    assert abs(sums - diff).max() < 1e-5 * (1 + abs(diff).max())
    outside = {"embed", "pos_embed"} if family == "gpt2" else {"embed"}
    assert set(rows.canonical) == {"blocks.0", "blocks.1", "", *outside}  # "": rest and bias
    hand = hand_dla(family, model, read)
    assert len(rows[rows.component != "rest"].groupby(["component", "block", "head"])) == len(hand)
    for (component, block, head), want in hand.items():
        got = rows[(rows.component == component) & (rows.block == block) & (rows["head"] == head)].sort_values("sample")
        assert got.contribution.to_numpy() == pytest.approx(want.numpy(), abs=1e-5 * (1 + abs(diff).max())), \
            (component, block, head)
    assert abs(rows[rows.component == "rest"].contribution).max() < 1e-5


PHI3 = transformers.Phi3Config(pad_token_id=0, **GQA, **SMALL)
#: A family the vocabulary does not know, declared in a module of the user's own (a temporary folder), as the
#: how-to page shows it.
PHI3_FAMILY = blocks(section(PAGE, "Declare a family"), "python")[0]


def refused(capsys, tmp_path, *chosen: str) -> str:
    """The one line a refused command prints; the run's folder stays without tables."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli(list(chosen), tmp_path / "out")
    assert exit_.value.code == 2
    assert not list((tmp_path / "out").rglob("*.parquet"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_an_unknown_family_is_one_line_and_one_declared_table_makes_it_read(tmp_path, capsys, monkeypatch):
    save(PHI3, tmp_path / "phi3")
    chosen = overrides(tmp_path / "phi3", "hooks=[dla,logit_lens]", f"hooks.dla.diff=[{DIFF[0]},{DIFF[1]}]",
                       f"hooks.logit_lens.top_k={VOCAB}")
    assert refused(capsys, tmp_path, *chosen) == (
        "error: hooks.dla: Phi3ForCausalLM (model_type 'phi3') is not a family the vocabulary knows; known: gpt2, "
        "gpt_neox, llama, mistral, qwen2, qwen3, gemma2, gemma3_text; declare one: a module named by model._module_ "
        "that registers a hooks.mechanism.families.Family with @FAMILIES.register (docs/how-to/model-families.md)")

    (tmp_path / "phi3_family.py").write_text(PHI3_FAMILY)
    monkeypatch.syspath_prepend(str(tmp_path))
    from hooks.mechanism.families import FAMILIES
    monkeypatch.setattr(FAMILIES, "_entries", dict(FAMILIES._entries))  # the declared table leaves with the test
    declared = (*chosen, "+model._module_=phi3_family")
    run_dir = run(make_config(*declared), tmp_path / "run", declared)
    model, logits, _ = hand_pass(tmp_path / "phi3", chosen)
    lens = load_table(run_dir, LENS)
    last = lens[lens.block == 1].sort_values(["sample", "position"])
    got = torch.tensor(np.stack(last.top_logits.to_numpy()), dtype=torch.float64).reshape(logits.shape)
    torch.testing.assert_close(got, logits.sort(-1, descending=True).values, rtol=0, atol=1e-5)
    rows = load_table(run_dir, DLA)
    sums = rows[rows.component.isin(["embed", "attn", "mlp", "rest", "bias"])].groupby("sample").contribution.sum()
    diff = (logits[:, -1, DIFF[0]] - logits[:, -1, DIFF[1]]).numpy()
    assert abs(sums.to_numpy() - diff).max() < 1e-5 * (1 + abs(diff).max())


def test_a_name_the_family_lacks_and_a_capped_dla_are_one_line_each(folders, tmp_path, capsys):
    lacking = overrides(folders["llama"], *STATS, "hooks.stats.layers=blocks.0.attn.hook_z")
    assert refused(capsys, tmp_path, *lacking) == blocks(section(PAGE, "The canonical names"), "text")[0].strip()
    assert refused(capsys, tmp_path, "model=mlp", "data=randn", *STATS, "hooks.stats.layers=blocks.*").startswith(
        "error: hooks.stats.layers: 'blocks.*' matches no module")  # a model of one's own: its own names were meant
    config = transformers.Gemma2Config(head_dim=8, final_logit_softcapping=30.0, **GQA, **SMALL)
    save(config, tmp_path / "capped")
    assert refused(capsys, tmp_path, *overrides(tmp_path / "capped", "hooks=dla", "hooks.dla.diff=[3,7]")) == (
        "error: hooks.dla: this gemma2 model caps its logits (c * tanh(logits / c), final_logit_softcapping=30.0), "
        "and a capped logit difference does not split into parts that add up; direct logit attribution reads a "
        "model without the cap")


def test_the_lens_reads_through_gemma2_s_logit_cap(tmp_path):
    save(transformers.Gemma2Config(head_dim=8, final_logit_softcapping=2.0, **GQA, **SMALL), tmp_path / "capped")
    chosen = overrides(tmp_path / "capped", "hooks=logit_lens", f"hooks.logit_lens.top_k={VOCAB}")
    lens = load_table(run(make_config(*chosen), tmp_path / "run", chosen), LENS)
    _, logits, _ = hand_pass(tmp_path / "capped", chosen)
    assert logits.abs().max() < 2.0  # the cap bites: an uncapped lens would not equal these
    last = lens[lens.block == 1].sort_values(["sample", "position"])
    got = torch.tensor(np.stack(last.top_logits.to_numpy()), dtype=torch.float64).reshape(logits.shape)
    torch.testing.assert_close(got, logits.sort(-1, descending=True).values, rtol=0, atol=1e-5)


def test_canonical_and_own_names_select_the_same_modules_and_plan_prints_the_vocabulary(folders, tmp_path, capsys):
    from conftest import stats_of
    from runner.cli.execute import execute

    own = overrides(folders["gpt_neox"], *STATS, "hooks.stats.layers=[gpt_neox.layers.1.mlp,gpt_neox.final_layer_norm]")
    canonical = overrides(folders["gpt_neox"], *STATS, "hooks.stats.layers=[blocks.1.mlp,ln_final]")
    a = stats_of(run(make_config(*own), tmp_path / "own", own))
    b = stats_of(run(make_config(*canonical), tmp_path / "canonical", canonical))
    assert sorted(set(b.layer)) == ["gpt_neox.final_layer_norm", "gpt_neox.layers.1.mlp"]
    pd.testing.assert_frame_equal(a[["layer", "kind", "l2", "max"]], b[["layer", "kind", "l2", "max"]])
    capsys.readouterr()
    execute(make_config("plan=true", *overrides(folders["qwen3"])), tmp_path / "plan", [])
    text = capsys.readouterr().out
    assert "vocabulary (qwen3 family: rmsnorm, gated mlp, grouped key/value heads 4/2, q/k norms; canonical -> module):" in text
    assert f"  {'blocks.1.attn.k_norm':<32} model.layers.1.self_attn.k_norm\n" in text
    execute(make_config("plan=true", *overrides(folders["gpt_neox"])), tmp_path / "plan_neox", [])
    assert "vocabulary (gpt_neox family: layernorm, mlp, parallel attention and mlp; canonical -> module):" in (
        capsys.readouterr().out)


def test_runs_over_three_families_load_as_one_table_by_canonical_name(folders, tmp_path):
    """The same experiment (one preset, one set of overrides) over three families' folders, read back as one table."""
    for family in ("gpt2", "llama", "gemma3"):
        chosen = overrides(folders[family], "hooks=logit_lens")
        run(make_config(*chosen), tmp_path / "runs" / family, chosen)
    lens = load_table(tmp_path / "runs", LENS)
    by_name = lens.groupby("canonical").layer.unique()
    assert list(by_name.index) == ["blocks.0", "blocks.1"]
    assert sorted(by_name["blocks.1"]) == ["model.layers.1", "transformer.h.1"]  # Llama's and Gemma3's, GPT-2's
    assert lens.groupby(["model.path", "canonical"]).size().tolist() == [2 * 16] * 6  # 2 samples x 16 positions each


def local_tokenizer():
    """A word-level tokenizer of the test vocabulary, built here: the bridge wants one and nothing is downloaded."""
    import tokenizers

    words = tokenizers.models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(words))


@pytest.mark.oracles
@pytest.mark.parametrize("family", ["gpt_neox", "llama", "mistral", "qwen2", "qwen3"])
def test_every_head_equals_transformer_lens_logit_attrs(folders, tmp_path, family):
    """TransformerLens 4's bridge, HookedTransformer's numerics (final norm folded into the unembedding): each
    head's, attention's, MLP's and the embedding's ``logit_attrs`` at every position. Gemma is left out: the
    bridge's head results are taken before Gemma's norm on the attention output, which ``dla`` applies."""
    from transformer_lens.model_bridge import TransformerBridge

    chosen = overrides(folders[family], "hooks=dla", f"hooks.dla.diff=[{DIFF[0]},{DIFF[1]}]", "hooks.dla.position=null")
    rows = load_table(run(make_config(*chosen), tmp_path / "run", chosen), DLA)
    x = next(compile_plan(make_config(*chosen)).data.batches(0, torch.device("cpu"))).x
    bridge = TransformerBridge.boot_transformers(str(folders[family]), device="cpu", tokenizer=local_tokenizer())
    bridge.enable_compatibility_mode()
    _, cache = bridge.run_with_cache(x)
    theirs = {}
    for stack, names in (cache.decompose_resid(layer=-1, mode="all", incl_embeds=True, return_labels=True),
                         cache.stack_head_results(layer=-1, return_labels=True)):
        theirs.update(dict(zip(names, cache.logit_attrs(stack, tokens=DIFF[0], incorrect_tokens=DIFF[1]).double())))
    heads = REAL[family][0].num_attention_heads
    for label, component, block, head in [("embed", "embed", -1, -1),
                                          *[(f"{b}_{c}_out", c, b, -1) for b in (0, 1) for c in ("attn", "mlp")],
                                          *[(f"L{b}H{h}", "head", b, h) for b in (0, 1) for h in range(heads)]]:
        ours = rows[(rows.component == component) & (rows.block == block) & (rows["head"] == head)]
        got = torch.tensor(ours.sort_values(["sample", "position"]).contribution.to_numpy()).reshape(x.shape)
        torch.testing.assert_close(got, theirs[label], rtol=0, atol=1e-5, msg=label)


@pytest.mark.parametrize("family", list(REAL))
def test_extract_by_canonical_name_equals_plain_hooks_on_each_family_s_own_modules(folders, tmp_path, family):
    """``blocks.*`` and ``blocks.*.mlp`` read each block's and MLP's output, as hooks on the family's own paths do."""
    import runner.analysis as analysis

    chosen = overrides(folders[family], "hooks=extract", "hooks.extract.layers=[blocks.*,blocks.*.mlp]",
                       "hooks.extract.kinds=[output]")
    got = analysis.load_tensors(run(make_config(*chosen), tmp_path / "run", chosen))
    _, _, read = hand_pass(folders[family], chosen)
    prefix, mlp = parts_of(family)["block"], parts_of(family)["mlp"]
    wanted = [f"{prefix}.{b}{part}" for b in (0, 1) for part in ("", f".{mlp}")]
    assert sorted(set(got.layer)) == sorted(wanted)
    for name in wanted:
        tensor = got[(got.layer == name) & (got.slot == "0")].tensor.iloc[0]
        torch.testing.assert_close(torch.as_tensor(tensor).double(), read[name], rtol=1e-5, atol=1e-5, msg=name)


def test_the_vocabulary_of_a_compiled_model_names_its_wrapped_modules():
    """``torch.compile`` puts ``_orig_mod.`` before every module name; the vocabulary's names follow."""
    from hooks.mechanism.families import vocabulary
    from hooks.mechanism.select import select_modules

    model = transformers.AutoModelForCausalLM.from_config(REAL["llama"][0])
    compiled = torch.compile(model)
    vocab = vocabulary(compiled, "hooks.x")
    assert vocab.names["blocks.1.mlp"] == "_orig_mod.model.layers.1.mlp" and vocab.names["unembed"] == "_orig_mod.lm_head"
    assert [m for _, m in select_modules(compiled, "blocks.*.mlp", "hooks.x.layers")] == [
        model.model.layers[0].mlp, model.model.layers[1].mlp]
