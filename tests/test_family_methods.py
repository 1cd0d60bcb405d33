"""Every method on every transformer family (issue 51), each against the same thing done with plain PyTorch hooks
registered by hand on the family's own modules (``model.model.layers[1].mlp``, ``gpt_neox.layers.0.attention``,
...). The runs name the canonical selectors (``blocks.*.mlp``, ``blocks.1.attn``, ``blocks.0``); the hand side
names each family's paths from ``test_families.parts_of``, written there independently of ``hooks.families``.

The families are ``test_families.REAL``'s (GPT-2, GPT-NeoX parallel and sequential, Llama with biases, Mistral,
Qwen2, Qwen3, Gemma2, Gemma3): two blocks, width 16, every weight and bias drawn at random, saved with
``save_pretrained`` beside the tiny tokenizer and loaded offline (``model=hf``). ``dla`` and the lens at the last
block are ``test_families``' (a float64 hand decomposition); here the lens is checked at every block."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import runner.analysis as analysis
from common.records import LENS
from conftest import make_config, run
from runner.analysis.load import load_table
from runner.analysis.units import load_units
from runner.engine.plan import compile_plan
from runner.store.activations import ActivationStore
from sae_folders import random_saelens
from test_families import REAL, VOCAB, parts_of, save
from test_generation import PROMPTS, TOKENIZER

transformers = pytest.importorskip("transformers")

#: The default run reads two families (NeoX: LayerNorm with biases, parallel attention and MLP; Gemma3: RMSNorm
#: times 1 + weight, norms on the attention's and MLP's outputs, q/k norms, grouped key/value heads); ``-m slow``
#: reads all nine (about 9 minutes on two shared cores).
FAMILIES = [family if family in ("gpt_neox", "gemma3") else pytest.param(family, marks=pytest.mark.slow)
            for family in REAL]
WIDTH = 16
DIFF = (3, 7)
NEW = 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family saved once, its special tokens the tiny tokenizer's (id 0), so generation stops where the
    tokenizer's end of text is. The tokenizer is named apart (``data.tokenizer``): saved beside a Qwen2 model,
    ``AutoTokenizer`` would read it as a ``Qwen2Tokenizer`` (config.json's model_type), every prompt one unknown token."""
    root = tmp_path_factory.mktemp("family_methods")
    for family, (config, _) in REAL.items():
        config = copy.deepcopy(config)
        config.bos_token_id = config.eos_token_id = config.pad_token_id = 0
        save(config, root / family)
    return {family: root / family for family in REAL}


def overrides(folder, *more: str) -> tuple[str, ...]:
    return ("model=hf", f"model.path={folder}", "model.auto=causal_lm", "data=tokens", "loss=none", "mode=eval",
            "steps=1", f"metric.diff=[{DIFF[0]},{DIFF[1]}]", *more)


def ran(tmp_path, name: str, *chosen: str):
    return run(make_config(*chosen), tmp_path / name, chosen)


def batches(chosen, n: int = 1) -> list[torch.Tensor]:
    """The first ``n`` batches the run of ``chosen`` reads."""
    return [b.x for b in itertools.islice(compile_plan(make_config(*chosen)).data.batches(0, torch.device("cpu")), n)]


def plain(folder) -> torch.nn.Module:
    """The saved model as the runner loads it (offline, its default attention), in eval mode."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    model.requires_grad_(False)
    return model


def real(family: str, canonical: str) -> str:
    """The family's own module path of a canonical name, from the test's own table of each family's parts."""
    p = parts_of(family)
    names = {"ln_final": p["final"], "unembed": "lm_head", "embed": p["embed"]}
    if canonical in names:
        return names[canonical]
    _, block, *part = canonical.split(".")
    own = {"attn": p["attn"], "mlp": p["mlp"], "ln1": p["ln1"], "ln_attn_out": p["attn_norm"]}
    return ".".join([p["block"], block, *(own[x] for x in part)])


def first(out):
    """The tensor a module's output holds first (an attention returns ``(output, weights)``)."""
    return out[0] if isinstance(out, tuple) else out


def replaced(out, value: torch.Tensor):
    return (value, *out[1:]) if isinstance(out, tuple) else value


def forward(model, x, edits: dict | None = None, keep=(), pre: dict | None = None):
    """The logits of ``model`` on ``x`` with forward hooks ``edits`` (path -> fn(tensor) -> tensor) and pre-hooks
    ``pre`` (path -> fn(first input) -> new first input) registered by hand for one call, and the first output
    of each module ``keep`` names (as it left the module, after its edit)."""
    kept, handles = {}, []
    for path, edit in (edits or {}).items():
        handles.append(model.get_submodule(path).register_forward_hook(
            lambda m, a, out, edit=edit: replaced(out, edit(first(out)))))
    for path, edit in (pre or {}).items():
        handles.append(model.get_submodule(path).register_forward_pre_hook(
            lambda m, args, edit=edit: (edit(args[0]), *args[1:])))
    def keeping(path):
        def hook(module, args, out) -> None:  # returns None: nothing is replaced
            kept.setdefault(path, first(out).detach().clone())
        return hook

    for path in keep:
        handles.append(model.get_submodule(path).register_forward_hook(keeping(path)))
    try:
        with torch.no_grad():
            logits = model(x).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, kept


def kept_logits(run_dir) -> torch.Tensor:
    """The ``lm_head`` output an ``extract`` of ``unembed`` kept in step 0."""
    rows = analysis.load_tensors(run_dir)
    rows = rows[(rows.layer == "lm_head") & (rows.step == 0)]
    assert len(rows) == 1, rows
    return torch.from_numpy(rows.iloc[0].tensor)


LOGITS = ("hooks.extract.layers=unembed",)


# -- observers: stats, extract, units, store -------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_stats_extract_units_and_store_equal_plain_hooks_on_the_family_s_own_modules(folders, tmp_path, family):
    """One run of two steps with four observers on canonical names; float64 statistics of the outputs plain
    forward hooks read on the family's own modules."""
    chosen = overrides(folders[family], "steps=2", "hooks=[stats,extract,units,store]",
                       "hooks.stats.kinds=[output]", "hooks.stats.layers=[blocks.*.mlp,blocks.1.attn]",
                       "hooks.extract.layers=[blocks.1.attn,blocks.0.ln1,ln_final]",
                       "hooks.units.layers=blocks.*.mlp", "hooks.store.layers=blocks.1",
                       f"hooks.store.path={tmp_path / 'store'}")
    out = ran(tmp_path, "run", *chosen)
    model = plain(folders[family])
    names = {c: real(family, c) for c in ("blocks.0.mlp", "blocks.1.mlp", "blocks.1.attn", "blocks.0.ln1",
                                          "ln_final", "blocks.1")}
    hand = [forward(model, x, keep=names.values())[1] for x in batches(chosen, 2)]

    stats = analysis.load_stats(out)
    stats = stats[(stats.hook == "stats") & (stats.kind == "output")]
    assert set(stats.layer) == {names["blocks.0.mlp"], names["blocks.1.mlp"], names["blocks.1.attn"]}
    for row in stats.itertuples():
        if row.layer == names["blocks.1.attn"] and row.slot != "0":
            continue  # the attention's weights, where the family's attention returns them
        want = hand[row.step][row.layer].double()
        assert (row.numel, list(row.tensor_shape)) == (want.numel(), list(want.shape))
        got = [row.mean, row.std, row.min, row.max, row.l2]
        wanted = [want.mean(), want.std(), want.min(), want.max(), want.norm()]
        np.testing.assert_allclose(got, [float(w) for w in wanted], rtol=1e-5, atol=1e-6, err_msg=row.layer)

    tensors = analysis.load_tensors(out)
    for canonical in ("blocks.1.attn", "blocks.0.ln1", "ln_final"):
        for step in (0, 1):
            got = tensors[(tensors.layer == names[canonical]) & (tensors.step == step) & (tensors.slot.isin(["", "0"]))]
            assert len(got) == 1, (canonical, got)
            torch.testing.assert_close(torch.from_numpy(got.iloc[0].tensor), hand[step][names[canonical]],
                                       rtol=0, atol=1e-6, msg=lambda m, w=canonical: f"{w}: {m}")

    units = load_units(out)
    for canonical in ("blocks.0.mlp", "blocks.1.mlp"):
        mine = units[units.layer == names[canonical]].sort_values("unit")
        values = torch.cat([h[names[canonical]] for h in hand]).reshape(-1, WIDTH).double()  # every sample and position
        assert list(mine.unit) == list(range(WIDTH)) and set(mine["count"]) == {len(values)}
        np.testing.assert_allclose(mine["mean"], values.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine["m2"] / mine["count"], values.var(0, unbiased=False), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(mine["min"], values.min(0).values, rtol=0, atol=1e-6)
        np.testing.assert_allclose(mine["max"], values.max(0).values, rtol=0, atol=1e-6)

    store = ActivationStore(tmp_path / "store" / names["blocks.1"])
    rows = [store[i] for i in range(len(store))]
    assert [sample for _, sample in rows] == [0, 1, 2, 3]
    torch.testing.assert_close(torch.stack([v for v, _ in rows]), torch.cat([h[names["blocks.1"]] for h in hand]),
                               rtol=0, atol=1e-6)


# -- edits: ablate, patch from a stored run, path patching, steer ------------------------------------------------
def resid_join(family: str, part: str) -> str:
    """The canonical module whose output joins the residual stream for ``part`` (attn or mlp) of block 0: Gemma
    normalises the attention's output (``ln_attn_out``) before adding it."""
    return "blocks.0.ln_attn_out" if part == "attn" and parts_of(family)["attn_norm"] else f"blocks.0.{part}"


@pytest.mark.parametrize("family", FAMILIES)
def test_ablations_equal_hand_written_ablations(folders, tmp_path, family):
    """Zero the attention's output of block 0 (its first slot) at position 5; replace block 1's MLP output by its
    batch mean: the logits equal those of the same edits written as forward hooks on the family's modules."""
    model, folder = plain(folders[family]), folders[family]
    zero = overrides(folder, "hooks=[ablate,extract]", *LOGITS, "hooks.ablate.layers=blocks.0.attn",
                     "hooks.ablate.slot=0", "hooks.ablate.index=5")
    mean = overrides(folder, "hooks=[ablate,extract]", *LOGITS, "hooks.ablate.layers=blocks.1.mlp",
                     "hooks.ablate.op=mean")

    def zeroed(t):
        t = t.clone()
        t[:, 5] = 0
        return t

    (x,) = batches(zero)
    for chosen, path, edit in ((zero, real(family, "blocks.0.attn"), zeroed),
                               (mean, real(family, "blocks.1.mlp"), lambda t: t.mean(0, keepdim=True).expand_as(t))):
        got = kept_logits(ran(tmp_path, chosen[-1].rsplit("=", 1)[1], *chosen))
        want, _ = forward(model, x, {path: edit})
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert (want - forward(model, x)[0]).abs().max() > 1e-3  # the ablation moved the logits


@pytest.mark.parametrize("family", FAMILIES)
def test_a_patch_from_a_stored_run_equals_hand_written_patching(folders, tmp_path, family):
    """A run on another batch keeps block 0's and the MLP's outputs; a run patches them in at position 15."""
    folder, model = folders[family], plain(folders[family])
    source = ran(tmp_path, "source", *overrides(folder, "data.seed=1", "hooks=extract",
                                                "hooks.extract.layers=[blocks.0,blocks.1.mlp]"))
    (clean,) = batches(overrides(folder, "data.seed=1"))
    for canonical in ("blocks.0", "blocks.1.mlp"):
        chosen = overrides(folder, "hooks=[patch,extract]", *LOGITS, f"hooks.patch.source={source}",
                           f"hooks.patch.layers={canonical}", "hooks.patch.index=15")
        (x,) = batches(chosen)
        path = real(family, canonical)
        _, kept = forward(model, clean, keep=[path])

        def patched(t):
            t = t.clone()
            t[:, 15] = kept[path][:, 15]
            return t

        want, _ = forward(model, x, {path: patched})
        torch.testing.assert_close(kept_logits(ran(tmp_path, canonical, *chosen)), want, rtol=0, atol=1e-5)
        assert (want - forward(model, x)[0])[:, 15].abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_path_patching_equals_the_hand_written_two_pass_loop(folders, tmp_path, family):
    """What block 0's attention sends block 1 through the residual stream, from a clean pass beside the step:
    block 1's input gets ``clean - corrupted`` of that output added at position 15, the MLP of block 0 still reads
    the corrupted one."""
    folder, model = folders[family], plain(folders[family])
    sender = resid_join(family, "attn")
    chosen = overrides(folder, "data.seed=1", "hooks=[patch,extract]", *LOGITS, "hooks.patch.source=clean",
                       f"hooks.patch.layers={sender}", "hooks.patch.receiver=blocks.1", "hooks.patch.index=15",
                       *(("hooks.patch.slot=0",) if sender.endswith("attn") else ()))
    (x,) = batches(chosen)
    (clean,) = batches(overrides(folder, "data.seed=0"))
    path = real(family, sender)
    _, sent = forward(model, clean, keep=[path])
    _, corrupted = forward(model, x, keep=[path])
    delta = torch.zeros_like(sent[path])
    delta[:, 15] = sent[path][:, 15] - corrupted[path][:, 15]
    want, _ = forward(model, x, pre={real(family, "blocks.1"): lambda h: h + delta})
    torch.testing.assert_close(kept_logits(ran(tmp_path, "run", *chosen)), want, rtol=0, atol=1e-5)
    whole, _ = forward(model, x, {path: lambda t: t + delta})
    if getattr(model.config, "use_parallel_residual", False):  # NeoX's MLP reads the block's input, not the attention's
        torch.testing.assert_close(want, whole, rtol=0, atol=1e-5)
    else:  # block 0's MLP read the corrupted value: a path, not the whole patch
        assert (want - whole).abs().max() > 1e-4


def hand_attribution(model, paths: list[str], clean, corrupted) -> dict[str, torch.Tensor]:
    """Per module, ``(clean - corrupted) output * d logit_diff / d output`` summed over every dim but positions."""
    _, kept = forward(model, clean, keep=paths)
    outputs, grads, handles = {}, {}, []

    def keep(path):
        def hook(module, args, out) -> None:
            outputs[path] = first(out)
            first(out).register_hook(lambda g: grads.__setitem__(path, g))
        return hook

    model.requires_grad_(True)
    try:
        handles = [model.get_submodule(path).register_forward_hook(keep(path)) for path in paths]
        logits = model(corrupted).logits
        (logits[:, -1, DIFF[0]] - logits[:, -1, DIFF[1]]).mean().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.requires_grad_(False)
    return {p: ((kept[p] - outputs[p].detach()) * grads[p]).sum(dim=(0, 2)) for p in paths}


@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_patching_equals_the_hand_written_gradient_times_difference(folders, tmp_path, family):
    folder, model = folders[family], plain(folders[family])
    layers = ["blocks.0", "blocks.1", "blocks.0.mlp", "blocks.1.attn"]
    chosen = overrides(folder, "data.seed=1", "hooks=attribution", f"hooks.attribution.layers=[{','.join(layers)}]",
                       "hooks.attribution.slot=0")
    rows = analysis.load_tensors(ran(tmp_path, "run", *chosen), filters=[("kind", "=", "attribution")])
    (x,) = batches(chosen)
    (clean,) = batches(overrides(folder, "data.seed=0"))
    want = hand_attribution(model, [real(family, c) for c in layers], clean, x)
    assert sorted(rows.layer) == sorted(want)
    for row in rows.itertuples():
        torch.testing.assert_close(torch.from_numpy(row.tensor).float(), want[row.layer], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, w=row.layer: f"{w}: {m}")
    assert all(w.abs().max() > 1e-4 for w in want.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_steering_equals_a_hand_written_hook(folders, tmp_path, family):
    folder, model = folders[family], plain(folders[family])
    vector = torch.from_numpy(np.random.default_rng(3).standard_normal(WIDTH)).float()
    np.save(tmp_path / "v.npy", vector.numpy())
    for canonical in ("blocks.0", "blocks.1.mlp"):
        chosen = overrides(folder, "hooks=[steer,extract]", *LOGITS, f"hooks.steer.layers={canonical}",
                           f"hooks.steer.file={tmp_path / 'v.npy'}", "hooks.steer.scale=2", "hooks.steer.baseline=false")
        (x,) = batches(chosen)
        want, _ = forward(model, x, {real(family, canonical): lambda t: t + 2 * vector})
        torch.testing.assert_close(kept_logits(ran(tmp_path, canonical, *chosen)), want, rtol=0, atol=1e-5)
        assert (want - forward(model, x)[0]).abs().max() > 1e-3


# -- readers: the logit lens at every block ----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_the_logit_lens_at_every_block_is_the_final_norm_and_unembedding_of_that_block_s_output(folders, tmp_path,
                                                                                                family):
    folder, model = folders[family], plain(folders[family])
    chosen = overrides(folder, "hooks=logit_lens", f"hooks.logit_lens.top_k={VOCAB}")
    lens = load_table(ran(tmp_path, "run", *chosen), LENS)
    (x,) = batches(chosen)
    blocks = [real(family, f"blocks.{b}") for b in (0, 1)]
    _, kept = forward(model, x, keep=blocks)
    final, unembed = model.get_submodule(real(family, "ln_final")), model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    for b, path in enumerate(blocks):
        with torch.no_grad():
            want = unembed(final(kept[path]))
        want = cap * torch.tanh(want / cap) if cap else want
        got = lens[lens.block == b].sort_values(["sample", "position"])
        got = torch.tensor(np.stack(got.top_logits.to_numpy()), dtype=want.dtype).reshape(want.shape)
        torch.testing.assert_close(got, want.sort(-1, descending=True).values, rtol=0, atol=1e-5, msg=lambda m, w=path: f"{w}: {m}")


# -- an SAE spliced at canonical hook points ---------------------------------------------------------------------
def hand_splice(folder, edit=lambda f: f):
    """``decode(edit(f)) + (x - decode(f))`` of the SAE's own tensors, read with safetensors."""
    w = load_file(folder / "sae_weights.safetensors")

    def splice(x):
        f = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
        return edit(f) @ w["W_dec"] + w["b_dec"] + (x - (f @ w["W_dec"] + w["b_dec"]))
    return splice


@pytest.mark.parametrize("family", FAMILIES)
def test_an_sae_spliced_at_canonical_points_leaves_the_logits_and_its_edit_equals_the_hand_splice(
        folders, tmp_path, family):
    folder, model = folders[family], plain(folders[family])
    sae = random_saelens(tmp_path / "sae", WIDTH, d_sae=8, seed=1)

    def steered(f):
        f = f.clone()
        f[..., [0, 3]] += 2.0
        return f

    for canonical in ("blocks.1", "blocks.0.mlp"):
        base = overrides(folder, "hooks=[sae,extract]", *LOGITS, f"hooks.sae.layers={canonical}", f"hooks.sae.path={sae}")
        (x,) = batches(base)
        torch.testing.assert_close(kept_logits(ran(tmp_path, canonical, *base)), forward(model, x)[0], rtol=0, atol=1e-5)
        edited = (*base, "hooks.sae.features=[0,3]", "hooks.sae.op=steer", "hooks.sae.value=2.0")
        want, _ = forward(model, x, {real(family, canonical): hand_splice(sae, steered)})
        torch.testing.assert_close(kept_logits(ran(tmp_path, f"{canonical}-edited", *edited)), want, rtol=0, atol=1e-5)
        assert (want - forward(model, x)[0]).abs().max() > 1e-3


# -- mode=generate ----------------------------------------------------------------------------------------------
def generate_by_hand(model, edits: dict | None = None) -> list[list[int]]:
    """``model.generate`` on the left-padded prompts with forward hooks ``edits`` registered by hand: each prompt's
    new tokens up to its first end-of-text token (id 0)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    handles = [model.get_submodule(path).register_forward_hook(lambda m, a, out, edit=edit: replaced(out, edit(first(out))))
               for path, edit in (edits or {}).items()]
    try:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=NEW, pad_token_id=0, do_sample=False)
    finally:
        for handle in handles:
            handle.remove()
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    return [row[:row.index(0) + 1] if 0 in row else row for row in rows]


def pushing(model, family: str) -> tuple[int, torch.Tensor]:
    """The token whose unembedding, through the final norm's gain (centred, as a LayerNorm centres), is longest,
    and that direction as a unit vector: added to the last block's output it makes the model say that token, on
    every family (a random vector does not move the random NeoX models off their one favourite token)."""
    gain = model.get_submodule(real(family, "ln_final")).weight + (1 if parts_of(family)["norm"] == "rms1" else 0)
    directions = model.get_output_embeddings().weight * gain
    directions = directions - directions.mean(-1, keepdim=True)
    token = int(directions.norm(dim=-1).argmax())
    return token, directions[token] / directions[token].norm()


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_plain_and_steered_equals_model_generate_with_a_hand_written_hook(folders, tmp_path, family):
    import pandas as pd

    folder, model = folders[family], plain(folders[family])
    token, vector = pushing(model, family)
    np.save(tmp_path / "v.npy", vector.numpy())
    text = ("model=hf", f"model.path={folder}", "model.auto=causal_lm", "data=text", f"data.tokenizer={TOKENIZER}",
            f"data.prompts=[{','.join(PROMPTS)}]", "mode=generate", "loss=none", f"generate.max_new_tokens={NEW}")
    steer = (*text, "hooks=steer", "hooks.steer.layers=blocks.1", f"hooks.steer.file={tmp_path / 'v.npy'}",
             "hooks.steer.scale=10", "hooks.steer.baseline=false")
    found = {}
    for name, chosen in (("plain", text), ("steered", steer)):
        table = pd.read_parquet(ran(tmp_path, name, *chosen) / "generations.parquet").sort_values("sample")
        found[name] = [[int(i) for i in ids] for ids in table.generated_ids]
    assert found["plain"] == generate_by_hand(model)
    steered = generate_by_hand(model, {real(family, "blocks.1"): lambda t: t + 10 * vector})
    assert found["steered"] == steered
    assert all(row[0] == token for row in steered) and steered != found["plain"]  # the steering moved the text
