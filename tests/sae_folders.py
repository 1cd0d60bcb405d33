"""SAELens folders with random weights for tests that need an SAE of a given width and architecture
(``hooks.types.sae``): ``cfg.json`` and ``sae_weights.safetensors`` as ``sae_lens.SAE.save_model`` writes them."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

#: The tensors sae-lens's ``save_model`` writes for each architecture (``batchtopk``: the training SAE's, its
#: ``topk_threshold`` one float64); ``W_enc`` is ``[d_in, d_sae]``, ``W_dec`` ``[d_sae, d_in]``, ``b_dec``
#: ``[d_in]``, the others ``[d_sae]``.
SAVED = {
    "standard": ("W_enc", "b_enc", "W_dec", "b_dec"),
    "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
    "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
    "batchtopk": ("W_enc", "b_enc", "W_dec", "b_dec", "topk_threshold"),
    "gated": ("W_enc", "b_gate", "b_mag", "r_mag", "W_dec", "b_dec"),
}


def random_saelens(folder: Path, d_in: int, d_sae: int = 4, seed: int = 0, architecture: str = "standard",
                   **cfg: object) -> Path:
    """An SAE of ``architecture`` reading ``d_in``-wide vectors into ``d_sae`` features, its tensors drawn from
    ``seed`` (thresholds positive); ``cfg``: more ``cfg.json`` keys (a ``topk`` SAE's ``k``: ``d_sae // 2``
    unless given)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_dec": (d_in,), "topk_threshold": ()}
    tensors = {name: torch.randn(shapes.get(name, (d_sae,)), generator=gen) * 0.3 for name in SAVED[architecture]}
    for name in ("threshold", "topk_threshold"):
        if name in tensors:
            tensors[name] = tensors[name].abs()
    if "topk_threshold" in tensors:
        tensors["topk_threshold"] = tensors["topk_threshold"].double()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "sae_weights.safetensors")
    defaults = {"k": max(1, d_sae // 2)} if architecture == "topk" else {}
    (folder / "cfg.json").write_text(json.dumps({"architecture": architecture, "d_in": d_in, "d_sae": d_sae,
                                                 "dtype": "float32", "apply_b_dec_to_input": True,
                                                 "normalize_activations": "none", **defaults, **cfg}))
    return folder
