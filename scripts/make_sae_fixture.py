"""Make the SAE fixtures of ``tests/test_sae*.py`` with sae-lens itself (run it with sae-lens 6 installed:
``DIR/bin/python scripts/make_sae_fixture.py [OUT_DIR]``, DIR built by ``scripts/make-peer-env.sh DIR 'sae-lens>=6,<7'``; default
``tests/fixtures``).

For each case below, a random-weight sae-lens SAE for gpt2_tiny's hidden size (d_in 32) with a tiny
d_sae, saved with ``save_model`` to ``OUT_DIR/sae_<case>/`` (``cfg.json``, ``sae_weights.safetensors``),
and, in ``OUT_DIR/sae_expected.safetensors``, sae-lens's own outputs on fixed inputs ``<case>.x``
``[2, 5, 32]``: ``encode`` (``<case>.features``), ``decode(encode(x))`` (``<case>.recon``), and the SAE
spliced with its error term (``use_error_term``) under each feature edit of ``EDITS``, made by a hook
on ``hook_sae_acts_post`` (``<case>.<edit>``). The weights are drawn from one seed: the same run
gives the same files.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig

D_IN, D_SAE = 32, 8
#: case -> (SAE class, config class, config keys)
CASES = {
    "standard": (StandardSAE, StandardSAEConfig, {"apply_b_dec_to_input": True, "normalize_activations": "none"}),
    "rescaled": (StandardSAE, StandardSAEConfig,
                 {"apply_b_dec_to_input": False, "normalize_activations": "constant_norm_rescale"}),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {"apply_b_dec_to_input": True, "normalize_activations": "layer_norm"}),
}
#: edit -> (features, what it does to them); the tests make the same edits with the ``sae`` hook type
EDITS = {
    "ablate": ([1, 3], lambda f: torch.zeros_like(f)),
    "clamp": ([2], lambda f: torch.full_like(f, 5.0)),
    "steer": ([0, 5], lambda f: f + 2.0),
}


def random_sae(case: str, seed: int):
    """An sae-lens SAE of ``case`` with every tensor drawn from ``seed`` (biases and thresholds too)."""
    cls, cfg_cls, keys = CASES[case]
    sae = cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, **keys))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sae.named_parameters():
            values = torch.randn(param.shape, generator=gen) * (0.3 if name.startswith("W") else 0.5)
            param.copy_(values.abs() if name == "threshold" else values)
    return sae.eval()


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


def main(out_dir: Path) -> None:
    expected: dict[str, torch.Tensor] = {}
    for seed, case in enumerate(CASES):
        sae = random_sae(case, seed)
        sae.save_model(out_dir / f"sae_{case}")
        x = torch.randn(2, 5, D_IN, generator=torch.Generator().manual_seed(100 + seed))
        expected.update(outputs(sae, x, case))
    save_file(expected, out_dir / "sae_expected.safetensors")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "fixtures")
