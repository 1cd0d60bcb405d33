"""``model=hf model.device_map=...``: a Hugging Face model loaded across devices and disk by accelerate
records what the same model loaded whole records (``stats``, ``extract``, ``patch``)."""
from __future__ import annotations

import shlex
import shutil

import numpy as np
import pytest
import torch

import runner.analysis as analysis
from conftest import docs_block, make_config
from runner.sources.models import build_model, gpt2_tiny

pytest.importorskip("accelerate", reason="device_map needs the 'accelerate' package")

IDS = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
STATS = ["mean", "std", "min", "max", "abs_mean", "l2", "zero_frac"]
#: Half of gpt2_tiny's blocks on the disk, the rest on the CPU.
OFFLOADED = ("model.device_map={transformer.wte: cpu, transformer.wpe: cpu, transformer.drop: cpu, transformer.h.0: cpu, "
             "transformer.h.1: disk, transformer.ln_f: cpu, lm_head: cpu}")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """gpt2_tiny saved with ``save_pretrained``, without dropout (both loads draw no random numbers)."""
    path = tmp_path_factory.mktemp("gpt2_tiny")
    torch.manual_seed(0)
    model = gpt2_tiny()
    model.config.update({"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    model.save_pretrained(path)
    return path


def assert_same_records(whole, offloaded) -> None:
    a = analysis.load_stats(whole).sort_values(IDS).reset_index(drop=True)
    b = analysis.load_stats(offloaded).sort_values(IDS).reset_index(drop=True)
    assert len(a) > 0 and a[IDS].values.tolist() == b[IDS].values.tolist()
    np.testing.assert_allclose(b[STATS].to_numpy(float), a[STATS].to_numpy(float), rtol=1e-5, atol=1e-7)


def test_a_model_offloaded_to_disk_records_what_the_whole_model_records(run_with, gpt2_dir, tmp_path):
    common = ("model=hf", f"model.path={gpt2_dir}", "data=tokens", "loss=none", "steps=2",
              "hooks=[stats,extract]", r"hooks.stats.layers=re:transformer\.h\.\d+\..*", "hooks.stats.kinds=[output]",
              "hooks.extract.layers=[transformer.h.0.mlp,transformer.h.1.mlp]")
    whole = run_with(*common)
    offloaded = run_with(*common, OFFLOADED, f"model.offload_folder={tmp_path / 'offload'}")
    loaded = build_model(make_config(*common, OFFLOADED, f"model.offload_folder={tmp_path / 'offload'}").model)
    assert loaded.hf_device_map["transformer.h.1"] == "disk"  # its weights are read from the disk at each call
    assert {p.device.type for p in loaded.transformer.h[1].parameters()} == {"meta"}
    assert_same_records(whole, offloaded)
    kept_a = analysis.load_tensors(whole).sort_values(IDS).reset_index(drop=True)
    kept_b = analysis.load_tensors(offloaded).sort_values(IDS).reset_index(drop=True)
    assert len(kept_a) == 4 and kept_a[IDS].values.tolist() == kept_b[IDS].values.tolist()
    for x, y in zip(kept_a.tensor, kept_b.tensor):
        np.testing.assert_allclose(np.asarray(y, float), np.asarray(x, float), rtol=1e-5, atol=1e-7)

    # patching the offloaded block with the whole model's outputs of another batch
    source = run_with("model=hf", f"model.path={gpt2_dir}", "data=tokens", "data.seed=7", "loss=none", "steps=2",
                      "hooks=extract", "hooks.extract.layers=[transformer.h.1.mlp]")
    patch = ("hooks=[patch,stats]", "hooks.patch.layers=transformer.h.1.mlp", f"hooks.patch.source={source}",
             "hooks.stats.layers=[transformer.h.1,transformer.ln_f]", "hooks.stats.kinds=[output]")
    common = common[:5]
    whole = run_with(*common, *patch)
    offloaded = run_with(*common, *patch, OFFLOADED, f"model.offload_folder={tmp_path / 'offload2'}")
    assert_same_records(whole, offloaded)
    put = analysis.load_stats(offloaded, filters=[("kind", "=", "patched")]).sort_values("step")
    kept = analysis.load_stats(source).sort_values("step")  # what the source run kept is what was put in
    assert len(put) == 2 and put.step.tolist() == kept.step.tolist()
    np.testing.assert_allclose(put[STATS].to_numpy(float), kept[STATS].to_numpy(float), rtol=1e-6)



def test_the_readme_device_map_command_records_what_the_whole_model_records(run_with, gpt2_dir, tmp_path,
                                                                             monkeypatch):
    """The "Big models" command, run as written (its relative paths under a directory holding gpt2_tiny)."""
    command = next(block for block in (docs_block("how-to/big-models.md", "Big models", "bash", i) for i in range(3))
                   if "model=hf" in block).strip()  # the others are torchrun commands (test_fsdp_cli, lightning)
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "runner"]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(gpt2_dir, tmp_path / "gpt2_tiny")
    offloaded = run_with(*words[3:])
    whole = run_with(*[w for w in words[3:] if not w.startswith(("model.device_map=", "model.offload_folder="))])
    assert_same_records(whole, offloaded)
