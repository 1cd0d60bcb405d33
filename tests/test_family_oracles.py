"""The vocabulary's activations against the peers' own vocabularies.

TransformerLens 4's ``TransformerBridge`` (hook names ``blocks.i.hook_resid_post``, ``hook_attn_out``,
``hook_mlp_out``, raw Hugging Face numerics without compatibility mode): on every family it loads, each block's
output and what its attention and MLP add to the stream (Gemma's: the norms on their outputs, ``ln_attn_out`` and
``ln_mlp_out``, which is where the bridge reads them) equal its cache to 1e-5 (its own float32 arithmetic: 2e-6 seen).

nnterp 1.3 (one Llama-like vocabulary over nnsight, the peer issue 51
names): for every family of ``tests/test_families.py`` that nnterp's ``StandardizedTransformer`` loads offline
from the ``save_pretrained`` folder, each block's output (``blocks.i``), its attention's (``blocks.i.attn``) and
its MLP's (``blocks.i.mlp``), read by plain forward hooks on the modules our vocabulary names, equal nnterp's
``layers_output``, ``attentions_output`` and ``mlps_output`` bit for bit (all nine families, 2026-12-07). nnterp 1.3 needs nnsight 0.6, the
project's oracles nnsight 0.8: it runs from a venv of its own (``HOOK_RUNNER_NNTERP_PYTHON``, built by
``scripts/make-peer-env.sh DIR 'nnterp==1.3.*' 'nnsight>=0.6,<0.7'``)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from hooks.mechanism.select import select_modules
from test_families import REAL, local_tokenizer, save

transformers = pytest.importorskip("transformers")

NNTERP_PYTHON = os.environ.get("HOOK_RUNNER_NNTERP_PYTHON")
IDS = [[1, 5, 9, 3, 17, 2], [4, 4, 8, 60, 33, 12]]
#: The families nnterp 1.3 loads offline from such a folder (measured 2026-12-07): one failing to load is a regression.
LOADED = {"gpt2", "gpt_neox", "gpt_neox_sequential", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"}

NNTERP_SCRIPT = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from nnterp import StandardizedTransformer
root, ids = Path(sys.argv[1]), torch.tensor(json.loads(sys.argv[2]))
loaded = {}
for folder in sorted(p for p in root.iterdir() if p.is_dir()):
    try:
        model = StandardizedTransformer(str(folder))
    except Exception as exc:
        loaded[folder.name] = f"{type(exc).__name__}: {exc}"[:300]
        continue
    saved = {}
    with model.trace(ids):  # in the order the forward pass reaches them
        for i in range(model.num_layers):
            saved[f"blocks.{i}.attn"] = model.attentions_output[i].save()
            saved[f"blocks.{i}.mlp"] = model.mlps_output[i].save()
            saved[f"blocks.{i}"] = model.layers_output[i].save()
    save_file({k: v.detach().clone().contiguous() for k, v in saved.items()}, str(folder / "nnterp.safetensors"))
    loaded[folder.name] = "ok"
print(json.dumps(loaded))
"""


def ours(folder, names: list[str]) -> dict[str, torch.Tensor]:
    """The first tensor each named part's module outputs, by plain forward hooks on the modules the vocabulary names."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    got, handles = {}, []

    def keep(name: str, out) -> None:  # returns None: the module's output is left as it is
        got.setdefault(name, (out[0] if isinstance(out, tuple) else out).detach().clone())

    for name in names:
        (_, module), = select_modules(model, name, "oracle")
        handles.append(module.register_forward_hook(lambda m, args, out, name=name: keep(name, out)))
    with torch.no_grad():
        model(torch.tensor(IDS))
    for handle in handles:
        handle.remove()
    return got


@pytest.mark.oracles
@pytest.mark.skipif(not NNTERP_PYTHON, reason="HOOK_RUNNER_NNTERP_PYTHON is unset: nnterp 1.3 lives in a venv of its "
                    "own (it needs nnsight 0.6; scripts/make-peer-env.sh DIR 'nnterp==1.3.*' 'nnsight>=0.6,<0.7')")
def test_the_vocabulary_s_activations_equal_nnterp_s_on_every_family_it_loads(tmp_path):
    for family, (config, _) in REAL.items():
        save(config, tmp_path / family)
        tokenizer = local_tokenizer()
        tokenizer.pad_token = "t0"
        tokenizer.save_pretrained(tmp_path / family)
    proc = subprocess.run([NNTERP_PYTHON, "-c", NNTERP_SCRIPT, str(tmp_path), json.dumps(IDS)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.splitlines()[-1])
    assert {family for family, said in loaded.items() if said == "ok"} == LOADED, loaded
    for family in sorted(LOADED):
        theirs = load_file(tmp_path / family / "nnterp.safetensors")
        mine = ours(tmp_path / family, sorted(theirs))
        assert sorted(mine) == sorted(theirs)
        for name, tensor in theirs.items():
            assert torch.equal(mine[name], tensor), (family, name, float((mine[name] - tensor).abs().max()))


#: The bridge's hook of each part, and the canonical name whose module's output it is (Gemma: the norm on the
#: part's output, what joins the stream; elsewhere the part itself).
BRIDGE_HOOKS = {"hook_resid_post": ("", ""), "hook_attn_out": (".attn", ".ln_attn_out"),
                "hook_mlp_out": (".mlp", ".ln_mlp_out")}


@pytest.mark.oracles
@pytest.mark.parametrize("family", list(REAL))
def test_the_vocabulary_s_activations_equal_transformer_lens_s_cache(tmp_path, family):
    from transformer_lens.model_bridge import TransformerBridge

    config, _ = REAL[family]
    save(config, tmp_path / family)
    bridge = TransformerBridge.boot_transformers(str(tmp_path / family), device="cpu", tokenizer=local_tokenizer())
    _, cache = bridge.run_with_cache(torch.tensor(IDS))
    normed = family.startswith("gemma")
    pairs = {f"blocks.{i}{(part, gemma)[normed]}": f"blocks.{i}.{hook}"
             for i in range(config.num_hidden_layers) for hook, (part, gemma) in BRIDGE_HOOKS.items()}
    mine = ours(tmp_path / family, sorted(pairs))
    for name, hook in pairs.items():
        torch.testing.assert_close(mine[name], cache[hook], rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} / {hook}: {m}")
