"""``sae`` against sae-lens and plain PyTorch: feature activations, reconstruction and spliced outputs under
feature edits equal sae-lens 6's own (saved by ``scripts/make_sae_fixture.py`` in ``tests/fixtures``, to
1e-6); the spliced gpt2_tiny's logits equal those of hand-written hooks splicing the same SAE in plain PyTorch
(1e-5), unedited, steered and ablated, and an edit moves them by what the hand-written edit does;
the features are a module's output that ``units``, ``stats``, ``extract`` and ``store`` record and that
``ablate`` edits; and a bad folder, architecture, width or order is one line with status 2 before the run.
The ``sae``-marked test runs sae-lens itself (the python ``HOOK_RUNNER_SAE_PYTHON`` names: its own venv, built by
``scripts/make-sae-env.sh DIR``) on a freshly made SAE."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import runner
from hooks.formats.sae_format import load_saelens
from runner.analysis import load_stats, load_tensors
from runner.analysis.units import load_units
from runner.sources.models import gpt2_tiny
from runner.store.activations import ActivationStore
from sae_folders import random_saelens

pytestmark = pytest.mark.statistics

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = load_file(FIXTURES / "sae_expected.safetensors")
CASES = ("standard", "rescaled", "jumprelu")
#: the edits ``scripts/make_sae_fixture.py`` made with sae-lens: (features, op, value)
EDITS = {"ablate": ([1, 3], "ablate", 0.0), "clamp": ([2], "clamp", 5.0), "steer": ([0, 5], "steer", 2.0)}
LAYER = "transformer.h.0"
GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval")
#: sae-lens 6's python: its own venv (it pins transformer-lens < 4), built by ``scripts/make-sae-env.sh DIR``
SAE_PYTHON = os.environ.get("HOOK_RUNNER_SAE_PYTHON")


def sae_entry(case: str = "standard", layers: str = LAYER, **keys) -> dict:
    return {"type": "sae", "layers": layers, "path": str(FIXTURES / f"sae_{case}"), **keys}


def gpt2() -> nn.Module:
    """gpt2_tiny, whose blocks return their hidden states as one tensor."""
    torch.manual_seed(0)
    return gpt2_tiny().eval()


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(seed))


def spliced_in_identity(entry: dict, x: torch.Tensor, out_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The output of a module returning its input with the entry spliced at it, and the features seen there."""
    model = nn.Sequential(nn.Identity())
    seen = []
    with runner.attach(model, hooks={"sae": entry}, out_dir=out_dir) as attached:
        handle = model.get_submodule("0.sae").register_forward_hook(lambda m, a, out: seen.append(out))
        with torch.no_grad():
            out = model(x)
        handle.remove()
        attached.step()
    return out, seen[-1]  # the first call is the rehearsal on the meta device


@pytest.mark.parametrize("case", CASES)
def test_features_and_reconstruction_equal_sae_lens_s_encode_and_decode(case, tmp_path):
    x = EXPECTED[f"{case}.x"]
    out, features = spliced_in_identity(sae_entry(case, "0"), x, tmp_path / "run")
    torch.testing.assert_close(features, EXPECTED[f"{case}.features"], atol=1e-6, rtol=0)
    assert 0 < (features > 0).float().mean() < 1  # some features fire, some do not
    sae = load_saelens(str(FIXTURES / f"sae_{case}"))
    torch.testing.assert_close(sae.decode(sae.encode(x)), EXPECTED[f"{case}.recon"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out, x, atol=1e-6, rtol=0)  # decode(f) plus the error term is x


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("case", CASES)
def test_edited_features_spliced_with_the_error_term_equal_sae_lens_s(case, edit, tmp_path):
    features, op, value = EDITS[edit]
    x = EXPECTED[f"{case}.x"]
    out, _ = spliced_in_identity(sae_entry(case, "0", features=features, op=op, value=value), x, tmp_path / "run")
    torch.testing.assert_close(out, EXPECTED[f"{case}.{edit}"], atol=1e-6, rtol=0)
    assert (out - x).abs().max() > 0.1  # the edit changed the output


def hand_splice(edit: Callable[[torch.Tensor], torch.Tensor] = lambda f: f, seen: list | None = None):
    """A forward hook doing by hand what an ``sae`` entry does at a GPT-2 block:
    ``decode(edit(f)) + (x - decode(f))`` with the standard fixture's weights, read with safetensors, the
    error term without gradient; ``seen`` collects ``f``."""
    w = load_file(FIXTURES / "sae_standard" / "sae_weights.safetensors")

    def hook(module, args, x):
        f = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
        if seen is not None:
            seen.append(f.detach())
        with torch.no_grad():  # the error term carries no gradient, as in sae-lens
            error = x - (f @ w["W_dec"] + w["b_dec"])
        return edit(f) @ w["W_dec"] + w["b_dec"] + error
    return hook


def steering(features: list[int], value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``op: steer`` by hand: ``value`` added to ``features`` at every position."""
    def edit(f):
        f = f.clone()
        f[..., features] += value
        return f
    return edit


def hand_spliced(edits: dict[str, tuple[list[int], float]]):
    """``hand_splice`` steering, for each block ``edits`` names, its features by its value (``op: steer``)."""
    return {layer: hand_splice(steering(*edit)) for layer, edit in edits.items()}


def logits_with(model: nn.Module, x: torch.Tensor, hooks: dict) -> torch.Tensor:
    """The model's logits with forward ``hooks`` (by module name) registered by hand for one call."""
    handles = [model.get_submodule(layer).register_forward_hook(hook) for layer, hook in hooks.items()]
    try:
        with torch.no_grad():
            return model(x).logits
    finally:
        for handle in handles:
            handle.remove()


def test_the_spliced_model_s_logits_equal_hand_written_splices_and_an_edit_moves_them_as_the_hand_edit_does(tmp_path):
    """Catches a splice that does nothing (a no-op splice would leave the features module uncalled, and an
    edit would not move the logits), one that drops the error term, or an edit that does not reach decode.
    Unedited, the features module sees the hand-computed features and the logits are those of a hand-written
    hook splicing ``decode(f) + (x - decode(f))``; two SAEs at two blocks, each steering features, move the
    logits away from the plain model's by what two hand-written steering hooks move them; the features
    module leaves the model with the entries."""
    model, x = gpt2(), tokens(1)
    with torch.no_grad():
        plain = model(x).logits
    seen, hand_seen = [], []
    with runner.attach(model, hooks={"sae": sae_entry()}, out_dir=tmp_path / "plain") as attached:
        handle = model.get_submodule(f"{LAYER}.sae").register_forward_hook(lambda m, a, out: seen.append(out))
        with torch.no_grad():
            spliced = model(x).logits
        handle.remove()
        attached.step()
    by_hand = logits_with(model, x, {LAYER: hand_splice(seen=hand_seen)})
    assert len(seen) == 1, "the features module was not called once in the pass"
    torch.testing.assert_close(seen[0], hand_seen[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(spliced, by_hand, atol=1e-5, rtol=0)

    edits = {LAYER: ([0, 5], 3.0), "transformer.h.1": ([2], -1.5)}
    entries = {"sae": sae_entry(features=edits[LAYER][0], op="steer", value=edits[LAYER][1]),
               "sae_b": sae_entry(layers="transformer.h.1", features=edits["transformer.h.1"][0], op="steer",
                                  value=edits["transformer.h.1"][1])}
    with runner.attach(model, hooks=entries, out_dir=tmp_path / "edited") as attached:
        assert {"transformer.h.0.sae", "transformer.h.1.sae"} <= dict(model.named_modules()).keys()
        with torch.no_grad():
            steered = model(x).logits
        attached.step()
    assert not any(name.endswith(".sae") for name, _ in model.named_modules())
    moved_by_hand = logits_with(model, x, hand_spliced(edits)) - plain
    assert moved_by_hand.abs().max() > 0.1  # the hand-written edit moves the logits
    torch.testing.assert_close(steered - plain, moved_by_hand, atol=1e-5, rtol=0)


def test_gradients_through_the_splice_equal_a_hand_written_hook_s(tmp_path):
    """Backward through a steered SAE: every parameter's gradient is the hand-written splice's (the
    gradient reaches the block through the features; the error term carries none)."""
    edits = {LAYER: ([0, 5], 3.0)}
    model, x = gpt2(), tokens(2)
    with runner.attach(model, hooks={"sae": sae_entry(features=[0, 5], op="steer", value=3.0)},
                       out_dir=tmp_path / "run") as attached:
        model.zero_grad()
        loss = model(x).logits.pow(2).mean()
        loss.backward()
        spliced = {name: p.grad.clone() for name, p in model.named_parameters()}
        attached.step(loss)
    (handle,) = [model.get_submodule(layer).register_forward_hook(hook) for layer, hook in hand_spliced(edits).items()]
    model.zero_grad()
    model(x).logits.pow(2).mean().backward()
    handle.remove()
    for name, p in model.named_parameters():
        torch.testing.assert_close(spliced[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert spliced["transformer.h.0.mlp.c_fc.weight"].abs().max() > 0


def test_spliced_at_the_next_block_s_input_the_sae_sees_and_edits_what_it_did_at_the_output(tmp_path):
    """``target: input`` of ``transformer.h.1`` is the output of ``transformer.h.0``: the same features,
    and the same logits under the same edit."""
    model, x = gpt2(), tokens(1)
    found = {}
    for name, entry in {"output": sae_entry(features=[0, 5], op="clamp", value=4.0),
                        "input": sae_entry(layers="transformer.h.1", target="input", features=[0, 5], op="clamp",
                                           value=4.0)}.items():
        seen = []
        with runner.attach(model, hooks={"sae": entry}, out_dir=tmp_path / name) as attached:
            spliced = entry["layers"]
            handle = model.get_submodule(f"{spliced}.sae").register_forward_hook(lambda m, a, out: seen.append(out))
            with torch.no_grad():
                found[name] = (model(x).logits, seen)
            handle.remove()
            attached.step()
    torch.testing.assert_close(found["input"][1][-1], found["output"][1][-1], atol=1e-6, rtol=0)
    torch.testing.assert_close(found["input"][0], found["output"][0], atol=1e-5, rtol=0)
    with torch.no_grad():
        assert (found["input"][0] - model(x).logits).abs().max() > 1e-2


def block_features(model: nn.Module, batches: list[torch.Tensor]) -> torch.Tensor:
    """The standard fixture's features of ``transformer.h.0``'s output for each batch, by hand, stacked."""
    w = load_file(FIXTURES / "sae_standard" / "sae_weights.safetensors")
    kept = []
    handle = model.get_submodule(LAYER).register_forward_hook(lambda m, a, out: kept.append(out))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    handle.remove()
    return torch.cat([torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) for x in kept])


def test_units_stats_extract_and_store_record_the_features_as_units(tmp_path):
    """A feature is a unit: ``units`` over ``<layer>.sae`` gives each feature's mean, max and top example
    of the hand-computed features; ``stats``, ``extract`` and ``store`` see the same tensor."""
    model, batches = gpt2(), [tokens(seed) for seed in (1, 2, 3)]
    features = block_features(model, batches)  # [6 samples, 16 positions, 8 features]
    feats = f"{LAYER}.sae"
    entries = {"sae": sae_entry(), "units": {"type": "units", "layers": feats, "top_k": 2},
               "stats": {"type": "stats", "layers": feats, "kinds": ["output"]}, "extract": {"type": "capture", "layers": feats},
               "store": {"type": "store", "layers": feats, "path": str(tmp_path / "store")}}
    out = tmp_path / "run"
    with runner.attach(model, hooks=entries, out_dir=out) as attached:
        for batch in batches:
            with torch.no_grad():
                model(batch)
            attached.step()
    units = load_units(out).sort_values("unit")
    assert list(units.unit) == list(range(8)) and set(units.layer) == {feats}
    flat = features.reshape(-1, 8).double()
    np.testing.assert_allclose(units["mean"], flat.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(units["max"], flat.max(0).values, rtol=1e-6)
    per_sample = features.reshape(6, 16, 8)
    for unit, row in units.iterrows():
        sample, position = row.top_sample[0], row.top_position[0]
        assert per_sample[sample, position, row.unit] == pytest.approx(row.top_value[0], rel=1e-6)
        assert row.top_value[0] == pytest.approx(float(per_sample[..., row.unit].max()), rel=1e-6)
    kept = load_tensors(out)
    kept = kept[kept.layer == feats].sort_values("step")
    np.testing.assert_allclose(np.concatenate(list(kept.tensor)), features.numpy(), atol=1e-6)
    stats = load_stats(out)
    stats = stats[(stats.hook == "stats") & (stats.layer == feats)].sort_values("step")
    np.testing.assert_allclose(stats["mean"], [float(features[i:i + 2].mean()) for i in (0, 2, 4)], rtol=1e-5)
    stored = ActivationStore(tmp_path / "store" / feats)
    rows = [stored[i] for i in range(len(stored))]
    assert [sample for _, sample in rows] == list(range(6))
    np.testing.assert_allclose(torch.stack([values for values, _ in rows]).numpy(), features.numpy(), atol=1e-6)


def test_ablating_the_features_module_equals_a_hand_written_ablation_of_the_features(tmp_path):
    """Catches an edit on ``<layer>.sae`` that is not what gets decoded (the splice decoding the features it
    computed rather than the features module's edited output) and an ``op: ablate`` that zeroes the wrong
    features: an ``ablate`` entry on ``<layer>.sae`` and the ``sae`` entry's own ``op: ablate`` of features
    1-3 each give the logits of a hand-written hook decoding the features with 1-3 set to 0, plus the error
    term, and move them away from the plain model's."""
    model, x = gpt2(), tokens(1)
    with torch.no_grad():
        plain = model(x).logits

    def ablated(f):
        f = f.clone()
        f[..., 1:4] = 0
        return f

    by_hand = logits_with(model, x, {LAYER: hand_splice(ablated)})
    assert (by_hand - plain).abs().max() > 1e-2  # the hand-written ablation moves the logits
    for name, entries in {
        "ablate_type": {"sae": sae_entry(), "ablate": {"type": "ablate", "layers": f"{LAYER}.sae", "index": "..., 1:4"}},
        "own_op": {"sae": sae_entry(features="..., 1:4", op="ablate")},
    }.items():
        with runner.attach(model, hooks=entries, out_dir=tmp_path / name) as attached:
            with torch.no_grad():
                logits = model(x).logits
            attached.step()
        torch.testing.assert_close(logits, by_hand, atol=1e-5, rtol=0, msg=name)


def test_on_a_conv_map_the_sae_reads_each_pixel_s_channels_and_its_features_are_channels(tmp_path):
    """On ``[batch, channels, height, width]`` the SAE reads the channel vector at each pixel (the unit axis
    of ``units``): the features module outputs ``[batch, d_sae, height, width]``, and a steered feature
    gives the output of a hand-written hook doing the same along dim 1."""
    folder = random_saelens(tmp_path / "sae", d_in=4, d_sae=6)
    w = load_file(folder / "sae_weights.safetensors")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = torch.randn(2, 3, 5, 5)
    entry = {"type": "sae", "layers": "0", "path": str(folder), "features": [1, 4], "op": "steer", "value": 1.5}
    seen = []
    with runner.attach(model, hooks={"sae": entry}, out_dir=tmp_path / "run") as attached:
        handle = model.get_submodule("0.sae").register_forward_hook(lambda m, a, out: seen.append(out))
        with torch.no_grad():
            steered = model(x)
        handle.remove()
        attached.step()

    def by_hand(module, args, out):
        pixels = out.movedim(1, -1)
        f = torch.relu((pixels - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
        edited = f.clone()
        edited[..., [1, 4]] += 1.5
        return (edited @ w["W_dec"] - f @ w["W_dec"] + pixels).movedim(-1, 1)

    handle = model[0].register_forward_hook(by_hand)
    with torch.no_grad():
        expected = model(x)
    handle.remove()
    conv = model[0](x).detach()
    torch.testing.assert_close(seen[-1], torch.relu((conv.movedim(1, -1) - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
                               .movedim(-1, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(steered, expected, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert (steered - model(x)).abs().max() > 1e-2


class TorchSae(nn.Module):
    """Another format's SAE, as a loader named in ``_target_`` returns it: a module with its own
    ``encode``/``decode`` (here the standard fixture's weights read from a ``.pt`` file)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        for name, value in torch.load(Path(path) / "sae.pt", weights_only=True).items():
            self.register_buffer(name, value)

    def encode(self, x):
        return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)

    def decode(self, f):
        return f @ self.W_dec + self.b_dec


def test_another_format_s_loader_named_in_target_is_spliced_like_a_saelens_folder(tmp_path):
    torch.save(load_file(FIXTURES / "sae_standard" / "sae_weights.safetensors"), tmp_path / "sae.pt")
    features, op, value = EDITS["steer"]
    entry = {**sae_entry(features=features, op=op, value=value), "layers": "0", "path": str(tmp_path),
             "_target_": "test_sae.TorchSae"}
    out, seen = spliced_in_identity(entry, EXPECTED["standard.x"], tmp_path / "run")
    torch.testing.assert_close(seen, EXPECTED["standard.features"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out, EXPECTED["standard.steer"], atol=1e-6, rtol=0)


def broken_folder(tmp_path: Path, **cfg_changes) -> Path:
    folder = tmp_path / "sae_bad"
    shutil.copytree(FIXTURES / "sae_standard", folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, **cfg_changes}))
    return folder


@pytest.mark.parametrize("bad, message", [
    (("hooks.sae.path=/no/such/sae",),
     "error: hooks.sae.path: no folder at '/no/such/sae'; an SAE in SAELens's format is a folder holding cfg.json "
     "and sae_weights.safetensors"),
    (("hooks.sae.path=TOPK",),
     "error: hooks.sae.path: the SAE at 'TOPK' has architecture 'topk'; supported: standard, jumprelu"),
    (("hooks.sae.path=STANDARD", "hooks.sae.layers=transformer.h.0.mlp.c_fc"),
     "error: hooks.sae.path: the SAE at 'STANDARD' reads vectors of d_in=32; 'transformer.h.0.mlp.c_fc' output is "
     "[..., 128], 128 units wide"),
    (("hooks=[units,sae]", "hooks.units.layers=transformer.h.0.sae", "hooks.sae.path=STANDARD"),
     "error: hooks.units.layers: 'transformer.h.0.sae' names the features of hooks.sae, which is listed after it; "
     "list hooks.sae first (hooks=[sae,units])"),
    (("hooks.sae.path=STANDARD", "hooks.sae.layers=transformer.h"),
     "error: hooks.sae.layers: 'transformer.h' is a container (ModuleList), which would call the features module "
     "added to it; splice at the module its output is, 'transformer.h.1'"),
    (("hooks=[sae,units]", "hooks.units.layers=transformer.h.0.sae", "hooks.sae.path=STANDARD", "hooks.sae.steps=[1,null]"),
     "error: hooks.units.steps: starts at step 0, before hooks.sae (step 1) adds the features "
     "'transformer.h.0.sae' names"),
    (("hooks.sae.path=STANDARD", "hooks.sae.features=[2,8]", "hooks.sae.op=ablate"),
     "error: hooks.sae.features: '[2, 8]' does not fit a tensor of shape [1, 8]: [2, 8] has a channel out of range "
     "for dim 1 (size 8)"),
    (("hooks.sae.path=STANDARD", "hooks.sae.op=clamp"),
     "error: hooks.sae.features: required with hooks.sae.op: an edit names the features (hooks.sae.features=[3,17]) "
     "and what it does (hooks.sae.op=ablate|clamp|steer)"),
])
def test_a_bad_sae_is_one_line_with_status_2_before_the_run(fault, tmp_path, bad, message):
    topk = broken_folder(tmp_path, architecture="topk")
    paths = {"TOPK": str(topk), "STANDARD": str(FIXTURES / "sae_standard")}
    for placeholder, path in paths.items():
        bad = tuple(b.replace(placeholder, path) for b in bad)
        message = message.replace(placeholder, path)
    presets = () if any(b.startswith("hooks=") for b in bad) else ("hooks=sae",)
    outcome = fault(*GPT2, *presets, *bad)
    assert (outcome.code, outcome.stderr) == (2, message)


@pytest.mark.sae
@pytest.mark.skipif(not SAE_PYTHON, reason="HOOK_RUNNER_SAE_PYTHON is unset: sae-lens 6 lives in its own venv (it pins "
                    "transformer-lens < 4; scripts/make-sae-env.sh DIR builds it, then set it to DIR/bin/python); "
                    "without it, the default tests against its saved outputs are the gate")
def test_sae_lens_live_on_a_fresh_sae_equals_the_preset(tmp_path):
    """sae-lens itself makes and runs a fresh set of SAEs (``scripts/make_sae_fixture.py``); the preset's
    features, reconstruction and edited splices equal what it computed."""
    script = Path(__file__).parents[1] / "scripts" / "make_sae_fixture.py"
    subprocess.run([SAE_PYTHON, str(script), str(tmp_path)], check=True, capture_output=True)
    fresh = load_file(tmp_path / "sae_expected.safetensors")
    for case in CASES:
        x = fresh[f"{case}.x"]
        sae = load_saelens(str(tmp_path / f"sae_{case}"))
        torch.testing.assert_close(sae.encode(x), fresh[f"{case}.features"], atol=1e-6, rtol=0)
        torch.testing.assert_close(sae.decode(sae.encode(x)), fresh[f"{case}.recon"], atol=1e-6, rtol=0)
        for edit, (features, op, value) in EDITS.items():
            entry = {**sae_entry(case, "0", features=features, op=op, value=value), "path": str(tmp_path / f"sae_{case}")}
            out, _ = spliced_in_identity(entry, x, tmp_path / f"run_{case}_{edit}")
            torch.testing.assert_close(out, fresh[f"{case}.{edit}"], atol=1e-6, rtol=0)
