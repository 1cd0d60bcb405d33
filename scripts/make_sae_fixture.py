"""Make the SAE fixtures of ``tests/test_sae*.py`` with sae-lens itself (run it with sae-lens 6 installed:
``DIR/bin/python scripts/make_sae_fixture.py [OUT_DIR] [--every]``, DIR built by
``scripts/make-peer-env.sh DIR 'sae-lens>=6,<7'``; default ``tests/fixtures``).

For each case of ``CASES`` (with ``--every``: of ``every_case()``, each architecture with each normalization
and ``apply_b_dec_to_input``), a random-weight sae-lens SAE for gpt2_tiny's hidden size (d_in 32) with a tiny
d_sae, saved with sae-lens's own ``save_model`` to ``OUT_DIR/sae_<case>/`` (``cfg.json``,
``sae_weights.safetensors``), and, in ``OUT_DIR/sae_expected.safetensors``, the outputs on fixed inputs
``<case>.x`` ``[2, 5, 32]`` of the SAE sae-lens's ``SAE.load_from_disk`` gives back for it (for a
``batchtopk`` folder, which it does not load, the JumpReLU SAE ``save_inference_model`` writes, as sae-lens
runs a BatchTopK SAE at inference): ``encode`` (``<case>.features``), ``decode(encode(x))``
(``<case>.recon``), and the SAE spliced with its error term (``use_error_term``) under each feature edit of
``EDITS``, made by a hook on ``hook_sae_acts_post`` (``<case>.<edit>``). The weights are drawn from one seed
per case: the same run gives the same files.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from sae_lens import (SAE, BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, GatedSAE, GatedSAEConfig, JumpReLUSAE,
                      JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig, TrainingSAE)

D_IN, D_SAE, K = 32, 8, 5
#: kind -> (SAE class, config class, config keys); ``batchtopk`` rescales by the decoder norms by default
KINDS = {
    "standard": (StandardSAE, StandardSAEConfig, {}),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
    "topk": (TopKSAE, TopKSAEConfig, {"k": K}),
    "topk_rescaled": (TopKSAE, TopKSAEConfig, {"k": K, "rescale_acts_by_decoder_norm": True}),
    "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, {"k": K}),
    "batchtopk_unrescaled": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig,
                             {"k": K, "rescale_acts_by_decoder_norm": False}),
    "gated": (GatedSAE, GatedSAEConfig, {}),
}
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
#: the cases kept in ``tests/fixtures``: case -> (kind, apply_b_dec_to_input, normalize_activations)
CASES = {
    "standard": ("standard", True, "none"),
    "rescaled": ("standard", False, "constant_norm_rescale"),
    "jumprelu": ("jumprelu", True, "layer_norm"),
    "topk": ("topk", True, "none"),
    "topk_rescaled": ("topk_rescaled", False, "constant_norm_rescale"),
    "batchtopk": ("batchtopk", True, "layer_norm"),
    "gated": ("gated", False, "none"),
}
#: edit -> (features, what it does to them); the tests make the same edits with the ``sae`` hook type
EDITS = {
    "ablate": ([1, 3], lambda f: torch.zeros_like(f)),
    "clamp": ([2], lambda f: torch.full_like(f, 5.0)),
    "steer": ([0, 5], lambda f: f + 2.0),
}


def every_case() -> dict[str, tuple[str, bool, str]]:
    """Each kind with each normalization, with and without ``b_dec`` taken off the input."""
    return {f"{kind}-{norm}-{'b_dec' if apply else 'no_b_dec'}": (kind, apply, norm)
            for kind in KINDS for norm in NORMALIZATIONS for apply in (True, False)}


def random_sae(kind: str, apply_b_dec: bool, norm: str, seed: int):
    """An sae-lens SAE of ``kind`` with every tensor drawn from ``seed`` (biases, thresholds, gates too)."""
    cls, cfg_cls, keys = KINDS[kind]
    sae = cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=apply_b_dec, normalize_activations=norm, **keys))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sae.named_parameters():
            values = torch.randn(param.shape, generator=gen) * (0.3 if name.startswith("W") else 0.5)
            param.copy_(values.abs() if name == "threshold" else values)
        if isinstance(sae, BatchTopKTrainingSAE):
            sae.topk_threshold = 0.5 + 0.5 * torch.randn((), generator=gen, dtype=torch.double).abs()
    return sae.eval()


def for_inference(sae, folder: Path):
    """The SAE sae-lens runs at inference from what ``save_model`` wrote to ``folder``."""
    if not isinstance(sae, TrainingSAE):
        return SAE.load_from_disk(folder)
    with tempfile.TemporaryDirectory() as tmp:
        sae.save_inference_model(tmp)
        return SAE.load_from_disk(tmp)


def outputs(sae, x: torch.Tensor, case: str) -> dict[str, torch.Tensor]:
    """sae-lens's encode, decode and edited splices of ``x``, keyed as the module docstring says."""
    with torch.no_grad():
        features = sae.encode(x)
        found = {f"{case}.x": x, f"{case}.features": features, f"{case}.recon": sae.decode(features)}
        sae.use_error_term = True
        for edit, (chosen, op) in EDITS.items():
            def hook(acts, hook, chosen=chosen, op=op):
                acts = acts.clone()
                acts[..., chosen] = op(acts[..., chosen])
                return acts
            with sae.hooks(fwd_hooks=[("hook_sae_acts_post", hook)]):
                found[f"{case}.{edit}"] = sae(x)
        sae.use_error_term = False
    return {key: t.contiguous() for key, t in found.items()}


def main(out_dir: Path, cases: dict[str, tuple[str, bool, str]]) -> None:
    expected: dict[str, torch.Tensor] = {}
    for seed, (case, (kind, apply_b_dec, norm)) in enumerate(cases.items()):
        sae = random_sae(kind, apply_b_dec, norm, seed)
        sae.save_model(out_dir / f"sae_{case}")
        x = torch.randn(2, 5, D_IN, generator=torch.Generator().manual_seed(100 + seed))
        expected.update(outputs(for_inference(sae, out_dir / f"sae_{case}"), x, case))
    save_file(expected, out_dir / "sae_expected.safetensors")


if __name__ == "__main__":
    args = [arg for arg in sys.argv[1:] if arg != "--every"]
    main(Path(args[0]) if args else Path(__file__).resolve().parents[1] / "tests" / "fixtures",
         every_case() if "--every" in sys.argv[1:] else CASES)
