"""``transcoder``'s readers against the libraries that write the formats, each run in a venv of its own: sae-lens
6 (``HOOK_RUNNER_SAE_PYTHON``, built by ``scripts/make-peer-env.sh DIR 'sae-lens>=6,<7'``) saves random-weight ``Transcoder``,
``SkipTranscoder``, ``JumpReLUTranscoder`` and ``JumpReLUSkipTranscoder`` with ``save_model`` and computes
``encode`` and ``forward``; circuit-tracer 0.5 (``HOOK_RUNNER_CIRCUIT_TRACER_PYTHON``: ``python -m venv
--system-site-packages DIR && DIR/bin/pip install "circuit-tracer==0.5.*"``, run offline) saves a
``TranscoderSet`` of skip JumpReLU ``SingleLayerTranscoder``s with ``to_safetensors`` and computes ``encode``
and ``forward`` per layer. The folders load through ``hooks.formats.transcoder_format``; features and outputs
(``decode(f) + skip``) equal the library's to 1e-6, and spliced with ``error: false`` at a ``Linear`` the
output is the library's ``forward``."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import runner
from hooks.formats.transcoder_format import check_folder, load_transcoder

SAE_PYTHON = os.environ.get("HOOK_RUNNER_SAE_PYTHON")
CT_PYTHON = os.environ.get("HOOK_RUNNER_CIRCUIT_TRACER_PYTHON")
D_IN, D_OUT, D_SAE = 6, 5, 8

SAE_LENS_SCRIPT = f"""
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from sae_lens.saes.transcoder import (Transcoder, TranscoderConfig, SkipTranscoder, SkipTranscoderConfig,
    JumpReLUTranscoder, JumpReLUTranscoderConfig, JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig)
out = Path(sys.argv[1]); expected = {{}}
for seed, (cls, cfg) in enumerate([(Transcoder, TranscoderConfig), (SkipTranscoder, SkipTranscoderConfig),
        (JumpReLUTranscoder, JumpReLUTranscoderConfig), (JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig)]):
    tc = cls(cfg(d_in={D_IN}, d_sae={D_SAE}, d_out={D_OUT}, apply_b_dec_to_input=False)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tc.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen).abs() * 0.3 if name == "threshold" else torch.randn(p.shape, generator=gen) * 0.5)
    arch = cfg.architecture()
    tc.save_model(out / arch)
    x = torch.randn(3, 4, {D_IN}, generator=gen)
    with torch.no_grad():
        expected.update({{arch + ".x": x, arch + ".features": tc.encode(x), arch + ".forward": tc(x)}})
save_file({{k: v.contiguous() for k, v in expected.items()}}, out / "expected.safetensors")
"""

CIRCUIT_TRACER_SCRIPT = f"""
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
from circuit_tracer.transcoder.activation_functions import JumpReLU
out = Path(sys.argv[1]); gen = torch.Generator().manual_seed(0); layers = {{}}; expected = {{}}
for layer in range(2):
    threshold = torch.randn({D_SAE}, generator=gen) * 0.3  # either sign: its JumpReLU has no ReLU
    tc = SingleLayerTranscoder({D_OUT}, {D_SAE}, JumpReLU(threshold, 0.1), layer, skip_connection=True,
                               device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        for name, p in tc.named_parameters():
            if name != "activation_function.threshold":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    layers[layer] = tc
    x = torch.randn(3, 4, {D_OUT}, generator=gen)
    with torch.no_grad():
        expected.update({{f"{{layer}}.x": x, f"{{layer}}.features": tc.encode(x), f"{{layer}}.forward": tc(x)}})
TranscoderSet(layers, "mlp.hook_in", "hook_mlp_out").to_safetensors(str(out / "transcoders"))
save_file({{k: v.contiguous() for k, v in expected.items()}}, out / "expected.safetensors")
"""


def made_by(python: str, script: str, out: Path) -> dict[str, torch.Tensor]:
    subprocess.run([python, "-c", script, str(out)], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return load_file(out / "expected.safetensors")


def spliced_at_a_linear(folder: Path, x: torch.Tensor, out_dir: Path) -> torch.Tensor:
    """The output of a ``Linear(D_IN, D_OUT)`` replaced by the transcoder (``error: false``)."""
    model = nn.Sequential(nn.Linear(x.shape[-1], D_OUT))
    entry = {"type": "transcoder", "layers": "0", "path": str(folder), "error": False}
    with runner.attach(model, hooks={"transcoder": entry}, out_dir=out_dir) as attached:
        with torch.no_grad():
            out = model(x)
        attached.step()
    return out


def output_of(tc, x: torch.Tensor) -> torch.Tensor:
    out = tc.decode(tc.encode(x))
    return out if tc.W_skip is None else out + x @ tc.W_skip.T


@pytest.mark.sae
@pytest.mark.skipif(not SAE_PYTHON, reason="HOOK_RUNNER_SAE_PYTHON is unset: sae-lens 6 lives in its own venv "
                    "(scripts/make-peer-env.sh DIR 'sae-lens>=6,<7' builds it); the default tests check against float64 by hand")
def test_sae_lens_s_saved_transcoders_encode_and_forward_as_sae_lens_does(tmp_path):
    expected = made_by(SAE_PYTHON, SAE_LENS_SCRIPT, tmp_path)
    for arch in ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"):
        x = expected[f"{arch}.x"]
        tc = load_transcoder(str(tmp_path / arch), check_folder(str(tmp_path / arch), "path"))
        torch.testing.assert_close(tc.encode(x), expected[f"{arch}.features"], atol=1e-6, rtol=0, msg=arch)
        assert 0 < (expected[f"{arch}.features"] > 0).double().mean() < 1
        torch.testing.assert_close(output_of(tc, x), expected[f"{arch}.forward"], atol=1e-6, rtol=0, msg=arch)
        torch.testing.assert_close(spliced_at_a_linear(tmp_path / arch, x, tmp_path / f"run_{arch}"),
                                   expected[f"{arch}.forward"], atol=1e-6, rtol=0, msg=arch)


@pytest.mark.oracles
@pytest.mark.skipif(not CT_PYTHON, reason="HOOK_RUNNER_CIRCUIT_TRACER_PYTHON is unset: circuit-tracer 0.5 lives in "
                    "its own venv; the default tests check against float64 by hand")
def test_circuit_tracer_s_saved_transcoders_encode_and_forward_as_circuit_tracer_does(tmp_path):
    expected = made_by(CT_PYTHON, CIRCUIT_TRACER_SCRIPT, tmp_path)
    found = check_folder(str(tmp_path / "transcoders"), "path")
    assert sorted(found["layers"]) == [0, 1]
    for layer, file in found["layers"].items():
        x = expected[f"{layer}.x"]
        tc = load_transcoder(str(file))
        torch.testing.assert_close(tc.encode(x), expected[f"{layer}.features"], atol=1e-6, rtol=0)
        assert (expected[f"{layer}.features"] < 0).any()  # its JumpReLU kept a negative pre-activation
        torch.testing.assert_close(output_of(tc, x), expected[f"{layer}.forward"], atol=1e-6, rtol=0)
