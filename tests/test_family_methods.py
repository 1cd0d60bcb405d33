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

FAMILIES = list(REAL)
WIDTH = 16
DIFF = (3, 7)
NEW = 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family saved once with the tiny tokenizer beside it; its special tokens are the tokenizer's
    (id 0), so generation stops where the tokenizer's end of text is."""
    root = tmp_path_factory.mktemp("family_methods")
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    for family, (config, _) in REAL.items():
        config = copy.deepcopy(config)
        config.bos_token_id = config.eos_token_id = config.pad_token_id = 0
        save(config, root / family)
        tokenizer.save_pretrained(root / family)
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
                                       rtol=0, atol=1e-6, msg=canonical)

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
