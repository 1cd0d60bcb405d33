"""``transcoder`` against hand-written float64 transcoders: the features and the outputs of SAELens-format and
circuit-tracer-format transcoders (plain, skip, JumpReLU) equal a float64 computation from the files' tensors
(1e-6); with the error term, every block's MLP spliced leaves the logits of a small GPT-2 and a small Llama
unchanged (1e-5), and without it they move; gradients reach the MLP's input through the features and the skip
term only; an edit of one feature moves the MLP's output by exactly what that feature's decoder row says; the
features are units for ``units``, ``stats`` and ``store``; and bad input is one line with status 2, nothing
written."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import runner
from runner.analysis import load_stats
from runner.analysis.units import load_units
from runner.sources.models import gpt2_tiny
from runner.store.activations import ActivationStore
from transcoder_folders import circuit_tracer_transcoders, saelens_transcoder

pytestmark = pytest.mark.statistics

transformers = pytest.importorskip("transformers")

GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval")
MLP = "transformer.h.0.mlp"
#: (format, skip term, jumprelu)
KINDS = [(fmt, skip, jump) for fmt in ("saelens", "circuit_tracer") for skip in (False, True) for jump in (False, True)]


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    return gpt2_tiny().eval()


def llama() -> nn.Module:
    """A two-block Llama from ``transformers`` with every weight and bias drawn at random (as ``test_families``)."""
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32, vocab_size=64,
                                      max_position_embeddings=64, num_attention_heads=4, num_key_value_heads=2,
                                      attention_bias=True, mlp_bias=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval()


def tokens(seed: int, vocab: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))


def folder_of(tmp_path: Path, fmt: str, skip: bool, jump: bool, blocks: int = 2, width: int = 32) -> Path:
    if fmt == "saelens":
        return saelens_transcoder(tmp_path / "tc", width, width, skip=skip, jumprelu=jump)
    return circuit_tracer_transcoders(tmp_path / "tc", blocks, width, skip=skip, jumprelu=jump)


def hand_transcoder(folder: Path, block: int = 0) -> dict[str, torch.Tensor]:
    """The tensors of a folder's transcoder (block ``block``'s of a circuit-tracer folder) in float64, read with
    safetensors by hand, ``W_enc`` as ``[d_in, d_sae]``; ``jump``: how its JumpReLU reads a pre-activation."""
    if (folder / "cfg.json").is_file():
        w = {name: t.double() for name, t in load_file(folder / "sae_weights.safetensors").items()}
        return {**w, "jump": "relu_then_threshold"} if "threshold" in w else w
    w = {name: t.double() for name, t in load_file(folder / f"layer_{block}.safetensors").items()}
    w["W_enc"] = w["W_enc"].T
    if "activation_function.threshold" in w:
        return {**w, "threshold": w.pop("activation_function.threshold"), "jump": "threshold_only"}
    return w


def hand_features(w: dict, a: torch.Tensor) -> torch.Tensor:
    pre = a.double() @ w["W_enc"] + w["b_enc"]
    if "threshold" not in w:
        return torch.relu(pre)
    kept = (pre > w["threshold"]).double()
    return (torch.relu(pre) if w["jump"] == "relu_then_threshold" else pre) * kept


def hand_output(w: dict, a: torch.Tensor, f: torch.Tensor | None = None) -> torch.Tensor:
    """``decode(f) + a @ W_skip.T`` in float64 (``f``: the features of ``a`` unless given)."""
    f = hand_features(w, a) if f is None else f
    out = f @ w["W_dec"] + w["b_dec"]
    return out + a.double() @ w["W_skip"].T if "W_skip" in w else out


def spliced_pass(model: nn.Module, entries: dict, x: torch.Tensor, out_dir: Path, layers: list[str]):
    """The model's output with ``entries`` attached, and per layer the module's input and (spliced) output and
    the features its transcoder module gave, seen by hooks registered after the entries'."""
    seen: dict[str, dict[str, list]] = {layer: {"in": [], "out": [], "features": []} for layer in layers}
    with runner.attach(model, hooks=entries, out_dir=out_dir) as attached:
        handles = []
        for layer in layers:
            def at_mlp(m, args, out, layer=layer):
                seen[layer]["in"].append(args[0].detach())
                seen[layer]["out"].append(out.detach())
            handles.append(model.get_submodule(layer).register_forward_hook(at_mlp))
            handles.append(model.get_submodule(f"{layer}.transcoder").register_forward_hook(
                lambda m, a, out, layer=layer: seen[layer]["features"].append(out.detach())))
        with torch.no_grad():
            out = model(x)
        for handle in handles:
            handle.remove()
        attached.step()
    return out, {layer: {k: v[-1] for k, v in found.items()} for layer, found in seen.items()}, seen


@pytest.mark.parametrize("fmt, skip, jump", KINDS)
def test_features_and_outputs_equal_a_hand_written_float64_transcoder(tmp_path, fmt, skip, jump):
    """Without the error term the MLP's output is the transcoder's own: features and output equal a float64
    computation from the file's tensors (circuit-tracer's JumpReLU keeps a negative pre-activation above a
    negative threshold; SAELens's takes the ReLU first); each feature module was called once."""
    folder = folder_of(tmp_path, fmt, skip, jump)
    entry = {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(folder), "error": False}
    layers = [MLP, "transformer.h.1.mlp"]
    _, last, seen = spliced_pass(gpt2(), {"transcoder": entry}, tokens(1), tmp_path / "run", layers)
    for block, layer in enumerate(layers):
        w = hand_transcoder(folder, block)
        expected = hand_features(w, last[layer]["in"])
        assert len(seen[layer]["features"]) == 1  # once in the pass
        torch.testing.assert_close(last[layer]["features"].double(), expected, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(last[layer]["out"].double(), hand_output(w, last[layer]["in"]), atol=1e-6, rtol=1e-6)
        assert 0 < (expected != 0).double().mean() < 1  # some features fire, some do not
        if fmt == "circuit_tracer" and jump:
            assert (expected < 0).any()  # a feature kept below zero: the JumpReLU without a ReLU


def test_a_transcoder_reading_and_writing_different_widths_equals_the_hand_written_one(tmp_path):
    """d_in 6, d_out 5 (a SAELens skip JumpReLU transcoder at a ``Linear(6, 5)``): features and output."""
    folder = saelens_transcoder(tmp_path / "tc", 6, 5, skip=True, jumprelu=True)
    model = nn.Sequential(nn.Linear(6, 5))
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(3))
    entry = {"type": "transcoder", "layers": "0", "path": str(folder), "error": False}
    out, seen, _ = spliced_pass(model, {"transcoder": entry}, x, tmp_path / "run", ["0"])
    w = hand_transcoder(folder)
    torch.testing.assert_close(seen["0"]["features"].double(), hand_features(w, x), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.double(), hand_output(w, x), atol=1e-6, rtol=1e-6)


def test_gradients_reach_the_input_through_the_features_and_the_skip_term_only(tmp_path):
    """With the error term the output is the module's own, but its gradient with respect to the module's input
    is that of ``decode(encode(a)) + skip(a)`` (the error term carries none), computed in float64 by autograd."""
    folder = saelens_transcoder(tmp_path / "tc", 6, 5, skip=True)
    model = nn.Sequential(nn.Linear(6, 5))
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(4), requires_grad=True)
    weights = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(5))
    with runner.attach(model, hooks={"transcoder": {"type": "transcoder", "layers": "0", "path": str(folder)}},
                       out_dir=tmp_path / "run") as attached:
        out = model(x)
        (grad,) = torch.autograd.grad((out * weights).sum(), x)
        attached.step()
    torch.testing.assert_close(out, model(x), atol=1e-6, rtol=0)  # the error term: the module's output
    x64 = x.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad((hand_output(hand_transcoder(folder), x64) * weights.double()).sum(), x64)
    torch.testing.assert_close(grad.double(), expected, atol=1e-6, rtol=1e-5)
    plain = torch.autograd.grad((model(x) * weights).sum(), x)[0]
    assert (grad - plain).abs().max() > 1e-2  # not the MLP's own gradient


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_block_spliced_with_error_terms_leaves_the_logits_unchanged(tmp_path, family):
    """A circuit-tracer skip JumpReLU transcoder at every block's MLP: the logits equal the plain model's to 1e-5
    with the error terms; without them they move (the splice acts), and each block's MLP output is then its
    hand-written transcoder's."""
    model, width, vocab = (gpt2(), 32, 100) if family == "gpt2" else (llama(), 16, 64)
    x = tokens(2, vocab)
    folder = circuit_tracer_transcoders(tmp_path / "tc", 2, width, skip=True, jumprelu=True)
    layers = [name for name, _ in model.named_modules() if name.endswith(".mlp")]
    with torch.no_grad():
        plain = model(x).logits
    entry = {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(folder)}
    kept = spliced_pass(model, {"transcoder": entry}, x, tmp_path / "kept", layers)[0].logits
    torch.testing.assert_close(kept, plain, atol=1e-5, rtol=0)
    replaced, last, _ = spliced_pass(model, {"transcoder": {**entry, "error": False}}, x, tmp_path / "replaced", layers)
    assert (replaced.logits - plain).abs().max() > 1e-2
    for block, layer in enumerate(layers):
        torch.testing.assert_close(last[layer]["out"].double(), hand_output(hand_transcoder(folder, block),
                                                                             last[layer]["in"]), atol=1e-5, rtol=1e-5)


#: edit -> (the entries' keys beside the transcoder's own, what it does to feature FEATURE's activation)
EDITS = {
    "own_ablate": (lambda k: ({"features": [k], "op": "ablate"}, {}), lambda f: -f),
    "ablate_type": (lambda k: ({}, {"ablate": {"type": "ablate", "layers": f"{MLP}.transcoder", "index": f"..., {k}"}}),
                    lambda f: -f),
    "clamp": (lambda k: ({"features": [k], "op": "clamp", "value": 2.5}, {}), lambda f: 2.5 - f),
    "steer": (lambda k: ({"features": [k], "op": "steer", "value": -1.5}, {}), lambda f: torch.full_like(f, -1.5)),
}


@pytest.mark.parametrize("edit", EDITS)
def test_editing_one_feature_moves_the_mlp_output_by_that_feature_s_decoder_row(tmp_path, edit):
    """Ablating feature k moves the MLP's output by exactly ``-f_k W_dec[k]`` at each position (clamping by
    ``(c - f_k) W_dec[k]``, steering by ``v W_dec[k]``), ``f_k`` computed by hand in float64."""
    folder = saelens_transcoder(tmp_path / "tc", 32, 32, skip=True, jumprelu=True)
    w = hand_transcoder(folder)
    model, x = gpt2(), tokens(3)
    plain_entry = {"type": "transcoder", "layers": MLP, "path": str(folder)}
    _, plain, _ = spliced_pass(model, {"transcoder": plain_entry}, x, tmp_path / "plain", [MLP])
    f = hand_features(w, plain[MLP]["in"])
    k = int((f != 0).sum(dim=(0, 1)).argmax())  # the feature active at the most positions
    assert 0 < (f[..., k] != 0).sum() < f[..., k].numel()
    own, others = EDITS[edit][0](k)
    _, edited, _ = spliced_pass(model, {"transcoder": {**plain_entry, **own}, **others}, x, tmp_path / "edited", [MLP])
    torch.testing.assert_close(edited[MLP]["in"], plain[MLP]["in"])  # block 0's MLP reads what it read
    moved = EDITS[edit][1](f[..., k]).unsqueeze(-1) * w["W_dec"][k]
    torch.testing.assert_close((edited[MLP]["out"] - plain[MLP]["out"]).double(), moved, atol=1e-5, rtol=0)
    assert moved.abs().max() > 0.05


def test_units_stats_and_store_record_the_features_as_units_over_a_dataset(tmp_path):
    """A feature is a unit: ``units`` over ``<mlp>.transcoder`` gives each feature's mean, max and top examples
    (sample, position, value) of the hand-computed features over three batches of tokens; ``stats`` and
    ``store`` see the same tensor."""
    folder = saelens_transcoder(tmp_path / "tc", 32, 32, skip=True)
    w = hand_transcoder(folder)
    model, batches = gpt2(), [tokens(seed) for seed in (1, 2, 3)]
    inputs = []
    handle = model.get_submodule(MLP).register_forward_hook(lambda m, a, out: inputs.append(a[0]))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    handle.remove()
    features = hand_features(w, torch.cat(inputs))  # [6 samples, 12 positions, 8 features], float64
    feats = f"{MLP}.transcoder"
    entries = {"transcoder": {"type": "transcoder", "layers": MLP, "path": str(folder)},
               "units": {"type": "units", "layers": feats, "top_k": 2},
               "stats": {"type": "stats", "layers": feats, "kinds": ["output"]},
               "store": {"type": "store", "layers": feats, "path": str(tmp_path / "store")}}
    out = tmp_path / "run"
    with runner.attach(model, hooks=entries, out_dir=out) as attached, torch.no_grad():
        for batch in batches:
            model(batch)
            attached.step()
    units = load_units(out).sort_values("unit")
    assert list(units.unit) == list(range(8)) and set(units.layer) == {feats}
    flat = features.reshape(-1, 8)
    np.testing.assert_allclose(units["mean"], flat.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(units["max"], flat.max(0).values, rtol=1e-5)
    for _, row in units.iterrows():
        column = features[..., row.unit]
        best = column.flatten().topk(2).values
        np.testing.assert_allclose(row.top_value, best, rtol=1e-5)
        for sample, position, value in zip(row.top_sample, row.top_position, row.top_value):
            assert float(column[sample, position]) == pytest.approx(value, rel=1e-5)
    stats = load_stats(out)
    stats = stats[(stats.hook == "stats") & (stats.layer == feats)].sort_values("step")
    np.testing.assert_allclose(stats["mean"], [float(features[i:i + 2].mean()) for i in (0, 2, 4)], rtol=1e-5)
    stored = ActivationStore(tmp_path / "store" / feats)
    np.testing.assert_allclose(torch.stack([stored[i][0] for i in range(len(stored))]).double(), features, atol=1e-6)


def bad_folders(tmp_path: Path) -> dict[str, str]:
    """Folders each bad in one way, by the placeholder the cases below write for them."""
    narrow = saelens_transcoder(tmp_path / "narrow", 16, 32)
    wide_out = saelens_transcoder(tmp_path / "wide_out", 32, 48)
    listed = saelens_transcoder(tmp_path / "clt", 32, 32)
    cfg = listed / "cfg.json"
    cfg.write_text(cfg.read_text().replace('"transcoder"', '"crosslayer_transcoder"'))
    return {"NARROW": str(narrow), "WIDE_OUT": str(wide_out), "CLT": str(listed),
            "NO_OUT": str(circuit_tracer_transcoders(tmp_path / "no_out", 2, 32, output_hook=None)),
            "ONE_BLOCK": str(circuit_tracer_transcoders(tmp_path / "one_block", 1, 32)),
            "CT": str(circuit_tracer_transcoders(tmp_path / "ct", 2, 32)),
            "SAE": str(Path(__file__).parent / "fixtures" / "sae_standard")}


@pytest.mark.parametrize("bad, message", [
    (("hooks.transcoder.path=SAE",),
     "error: hooks.transcoder.path: the folder 'SAE' holds an SAE (architecture 'standard'), which has no output point "
     "(no d_out): a transcoder reads one point and writes another; splice an SAE with hooks=sae, or give a transcoder "
     "(transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder)"),
    (("hooks.transcoder.path=NO_OUT",),
     "error: hooks.transcoder.path: 'NO_OUT/config.yaml' names no feature_output_hook: a transcoder without an output "
     "point; an MLP transcoder has feature_output_hook: hook_mlp_out"),
    (("hooks.transcoder.path=CLT",),
     "error: hooks.transcoder.path: 'CLT/cfg.json': unknown architecture 'crosslayer_transcoder'; valid: "
     "jumprelu_skip_transcoder, jumprelu_transcoder, skip_transcoder, transcoder; did you mean 'skip_transcoder'?"),
    (("hooks.transcoder.path=NARROW",),
     "error: hooks.transcoder.path: the transcoder at 'NARROW' reads vectors of d_in=16; 'transformer.h.0.mlp' input "
     "is [..., 32], 32 units wide"),
    (("hooks.transcoder.path=WIDE_OUT",),
     "error: hooks.transcoder.path: the transcoder at 'WIDE_OUT' writes vectors of d_out=48; 'transformer.h.0.mlp' "
     "output is [..., 32], 32 units wide"),
    (("hooks.transcoder.path=ONE_BLOCK",),
     "error: hooks.transcoder.path: 'ONE_BLOCK' has no layer_1.safetensors for 'transformer.h.1.mlp' (blocks.1.mlp); "
     "it holds the transcoders of blocks 0"),
    (("hooks.transcoder.path=CT", "hooks.transcoder.layers=transformer.h.0.attn"),
     "error: hooks.transcoder.layers: 'transformer.h.0.attn' is not a block's MLP; a circuit-tracer folder holds one "
     "transcoder per block, spliced at blocks.<i>.mlp (hooks.transcoder.layers=blocks.*.mlp)"),
    (("hooks.transcoder.path=CT", "hooks.transcoder.target=input"),
     "error: hooks.transcoder.target: 'input'; a transcoder reads the input of each module hooks.transcoder.layers "
     "names and replaces its output: target is output"),
    (("hooks.transcoder.path=CT", "hooks.transcoder.features=[8]", "hooks.transcoder.op=ablate"),
     "error: hooks.transcoder.features: '[8]' does not fit a tensor of shape [1, 8]: [8] has a channel out of range "
     "for dim 1 (size 8)"),
    (("hooks=[units,transcoder]", "hooks.units.layers=transformer.h.0.mlp.transcoder", "hooks.transcoder.path=CT"),
     "error: hooks.units.layers: 'transformer.h.0.mlp.transcoder' names the features of hooks.transcoder, which is "
     "listed after it; list hooks.transcoder first (hooks=[transcoder,units])"),
    (("hooks.transcoder.path=/no/such/folder",),
     "error: hooks.transcoder.path: no folder at '/no/such/folder'; a transcoder is a SAELens folder (cfg.json, "
     "sae_weights.safetensors) or a circuit-tracer folder (layer_<i>.safetensors)"),
])
def test_a_bad_transcoder_is_one_line_with_status_2_before_the_run(fault, tmp_path, bad, message):
    for placeholder, path in bad_folders(tmp_path).items():
        bad = tuple(b.replace(f"={placeholder}", f"={path}") for b in bad)
        message = message.replace(f"'{placeholder}", f"'{path}")
    presets = () if any(b.startswith("hooks=") for b in bad) else ("hooks=transcoder",)
    outcome = fault(*GPT2, *presets, *bad)
    assert (outcome.code, outcome.stderr) == (2, message)


def test_patching_the_features_from_another_run_moves_the_mlp_output_by_their_difference_through_w_dec(tmp_path):
    """``patch`` on ``<mlp>.transcoder`` from a run on other data (``data.seed=1``) puts that run's features in
    and decodes them: block 0's MLP output becomes ``y + (f_source - f) W_dec`` (the error term and the skip term
    are this run's), with ``f``, ``f_source`` and ``y`` the runs' own kept tensors."""
    from conftest import make_config, run
    from runner.analysis import load_tensors

    feats = f"{MLP}.transcoder"
    fixture = Path(__file__).parent / "fixtures" / "transcoders_gpt2_tiny"
    common = (*GPT2, "steps=2", "hooks.transcoder.layers=blocks.0.mlp", f"hooks.transcoder.path={fixture}",
              f"hooks.extract.layers=[{MLP},{feats}]")
    runs = {}
    for name, extra in {"source": ("hooks=[transcoder,extract]", "data.seed=1"),
                        "plain": ("hooks=[transcoder,extract]",),
                        "patched": ("hooks=[transcoder,patch,extract]", f"hooks.patch.layers={feats}")}.items():
        overrides = (*common, *extra) + ((f"hooks.patch.source={runs['source']}",) if name == "patched" else ())
        runs[name] = run(make_config(*overrides), tmp_path / name, overrides)

    def kept(name: str, layer: str) -> torch.Tensor:
        t = load_tensors(runs[name])
        t = t[(t.layer == layer) & (t.hook == "extract")].sort_values("step")
        return torch.from_numpy(np.concatenate(list(t.tensor))).double()

    w_dec = load_file(fixture / "layer_0.safetensors")["W_dec"].double()
    moved = (kept("source", feats) - kept("plain", feats)) @ w_dec
    assert moved.abs().max() > 0.05
    torch.testing.assert_close(kept("patched", feats), kept("source", feats), atol=1e-6, rtol=0)
    torch.testing.assert_close(kept("patched", MLP) - kept("plain", MLP), moved, atol=1e-5, rtol=0)


def test_the_transcoder_s_weights_are_stated_as_the_bytes_of_its_tensors(tmp_path):
    """``plan=true`` states what the entry holds on the host: the transcoder's tensors, loaded by hand (an MLP,
    which the meta device runs whole for the plan's rehearsal; gpt2_tiny's forward it cannot run, as for ``sae``)."""
    from conftest import make_config
    from runner.engine.budget import held, size_text
    from runner.engine.plan import compile_plan, describe

    folder = saelens_transcoder(tmp_path / "tc", 100, 200, d_sae=16, skip=True)
    real = sum(t.nbytes for t in load_file(folder / "sae_weights.safetensors").values())
    plan = compile_plan(make_config("model=mlp", "data.shape=[8,100]", "hooks=transcoder", "hooks.transcoder.layers=fc1",
                                    f"hooks.transcoder.path={folder}"))
    assert [(key, what, n) for key, what, n in held(plan.rehearsal)] == [("transcoder", "transcoder weights", real)]
    assert f"  hooks.transcoder: {size_text(real)} of transcoder weights" in describe(plan)
