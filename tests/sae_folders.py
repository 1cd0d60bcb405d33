"""SAELens folders with random weights for tests that need an SAE of a given width (``hooks.types.sae``):
``cfg.json`` and ``sae_weights.safetensors`` as ``sae_lens.SAE.save_model`` writes them."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def random_saelens(folder: Path, d_in: int, d_sae: int = 4, seed: int = 0) -> Path:
    """A standard SAE reading ``d_in``-wide vectors into ``d_sae`` features, its tensors drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()},
              folder / "sae_weights.safetensors")
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d_in, "d_sae": d_sae,
                                                 "dtype": "float32", "apply_b_dec_to_input": True,
                                                 "normalize_activations": "none"}))
    return folder
