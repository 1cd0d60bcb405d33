"""Transcoder folders with random weights, as SAELens 6 (``Transcoder.save_model``) and circuit-tracer 0.5
(``TranscoderSet.to_safetensors``) write them, for the tests of ``hooks.types.transcoder``."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

#: SAELens's name of each architecture by (skip term, jumprelu)
SAELENS_ARCHITECTURES = {(False, False): "transcoder", (True, False): "skip_transcoder",
                         (False, True): "jumprelu_transcoder", (True, True): "jumprelu_skip_transcoder"}


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Every tensor drawn from ``seed``; SAELens's thresholds positive, circuit-tracer's of either sign (its
    JumpReLU has no ReLU: a negative threshold lets a negative pre-activation through)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}
    if "threshold" in tensors:
        tensors["threshold"] = tensors["threshold"].abs() * 0.5
    return tensors


def saelens_transcoder(folder: Path, d_in: int, d_out: int, d_sae: int = 8, skip: bool = False,
                       jumprelu: bool = False, seed: int = 0) -> Path:
    """A SAELens transcoder folder: ``cfg.json`` and ``sae_weights.safetensors``."""
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    if skip:
        shapes["W_skip"] = (d_out, d_in)
    if jumprelu:
        shapes["threshold"] = (d_sae,)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(random_tensors(shapes, seed), folder / "sae_weights.safetensors")
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": SAELENS_ARCHITECTURES[skip, jumprelu], "d_in": d_in, "d_sae": d_sae, "d_out": d_out,
        "dtype": "float32", "apply_b_dec_to_input": False, "normalize_activations": "none"}))
    return folder


def circuit_tracer_transcoders(folder: Path, blocks: int, d_model: int, d_sae: int = 8, skip: bool = False,
                               jumprelu: bool = False, seed: int = 0, output_hook: str | None = "hook_mlp_out") -> Path:
    """A circuit-tracer folder: ``layer_<i>.safetensors`` per block (``W_enc`` ``[d_sae, d_model]``) and a
    ``config.yaml`` naming the points (``output_hook=None``: none for the output)."""
    folder.mkdir(parents=True, exist_ok=True)
    for block in range(blocks):
        shapes = {"W_enc": (d_sae, d_model), "b_enc": (d_sae,), "W_dec": (d_sae, d_model), "b_dec": (d_model,)}
        if skip:
            shapes["W_skip"] = (d_model, d_model)
        if jumprelu:
            shapes["activation_function.threshold"] = (d_sae,)
        save_file(random_tensors(shapes, seed + block), folder / f"layer_{block}.safetensors")
    lines = ["model_kind: transcoder_set", "feature_input_hook: mlp.hook_in"]
    lines += [f"feature_output_hook: {output_hook}"] if output_hook else []
    (folder / "config.yaml").write_text("\n".join(lines) + "\n")
    return folder
