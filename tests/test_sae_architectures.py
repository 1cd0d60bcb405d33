"""Every SAELens architecture ``hooks=sae`` reads (standard, jumprelu, topk, batchtopk, gated), with each
normalization and with and without ``b_dec`` taken off the input, against a float64 SAE written here from the
definitions (not from the module's code: the top k by sorting, thresholds by ``where``, the BatchTopK
threshold on the rescaled pre-activations rather than folded into the weights): the features (their active
sets exactly, values to 1e-5) and the reconstruction (1e-5). sae-lens's own outputs are checked in
``tests/test_sae.py``."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hooks.formats.sae_format import load_saelens
from sae_folders import random_saelens

D_IN, D_SAE = 12, 10
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
#: kind -> (architecture, its own cfg.json keys)
KINDS = {
    "standard": ("standard", {}),
    "jumprelu": ("jumprelu", {}),
    "topk": ("topk", {"k": 4}),
    "topk_rescaled": ("topk", {"k": 4, "rescale_acts_by_decoder_norm": True}),
    "batchtopk": ("batchtopk", {"k": 4, "rescale_acts_by_decoder_norm": True}),
    "batchtopk_unrescaled": ("batchtopk", {"k": 4, "rescale_acts_by_decoder_norm": False}),
    "gated": ("gated", {}),
}


def reference(folder: Path, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features, reconstruction)`` of ``x`` in float64 by the SAE in ``folder``, from the definitions."""
    cfg = json.loads((folder / "cfg.json").read_text())
    w = {name: t.double() for name, t in load_file(folder / "sae_weights.safetensors").items()}
    x = x.double()
    undo = lambda y: y  # noqa: E731
    if cfg["normalize_activations"] == "constant_norm_rescale":
        scale = D_IN ** 0.5 / x.norm(dim=-1, keepdim=True)
        x, undo = x * scale, lambda y: y / scale
    elif cfg["normalize_activations"] == "layer_norm":
        mu = x.mean(-1, keepdim=True)
        std = (x - mu).std(-1, keepdim=True)  # unbiased, as SAELens's
        x, undo = (x - mu) / (std + 1e-5), lambda y: y * std + mu
    if cfg["apply_b_dec_to_input"]:
        x = x - w["b_dec"]
    norms = w["W_dec"].norm(dim=-1)
    rescaled = cfg.get("rescale_acts_by_decoder_norm", False)
    zero = torch.zeros((), dtype=torch.float64)
    if cfg["architecture"] == "gated":
        magnitude = (x @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"]).clamp(min=0)
        features = torch.where(x @ w["W_enc"] + w["b_gate"] > 0, magnitude, zero)
    else:
        pre = x @ w["W_enc"] + w["b_enc"]
        pre = pre * norms if rescaled else pre
        if cfg["architecture"] == "topk":  # at least the k-th largest of its vector
            keep = pre >= pre.sort(dim=-1, descending=True).values[..., cfg["k"] - 1, None]
        else:
            keep = pre > w.get("threshold", w.get("topk_threshold", zero))
        features = torch.where(keep & (pre > 0), pre, zero)
    decoded = (features / norms if rescaled else features) @ w["W_dec"] + w["b_dec"]
    return features, undo(decoded)


@pytest.mark.parametrize("kind, norm, apply_b_dec", list(itertools.product(KINDS, NORMALIZATIONS, (True, False))))
def test_features_and_reconstruction_equal_a_float64_sae_of_the_definition(kind, norm, apply_b_dec, tmp_path):
    architecture, keys = KINDS[kind]
    folder = random_saelens(tmp_path / "sae", D_IN, d_sae=D_SAE, seed=3, architecture=architecture,
                            normalize_activations=norm, apply_b_dec_to_input=apply_b_dec, **keys)
    x = torch.randn(3, 7, D_IN, generator=torch.Generator().manual_seed(4)) * 2 + 0.5
    sae = load_saelens(str(folder))
    features = sae.encode(x)
    recon = sae.decode(features)
    want_features, want_recon = reference(folder, x)
    assert features.dtype == recon.dtype == torch.float32
    assert torch.equal(features > 0, want_features > 0)
    assert 0 < (features > 0).double().mean() < 1  # some fire, some do not
    if architecture == "topk":
        assert (features > 0).sum(-1).max() <= keys["k"]
    torch.testing.assert_close(features.double(), want_features, atol=1e-5, rtol=0)
    torch.testing.assert_close(recon.double(), want_recon, atol=1e-5, rtol=0)
