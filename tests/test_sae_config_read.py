"""An ``sae`` entry's run splices the SAE its config check saw: ``cfg.json`` is read once, when the entry is
built, and that reading (not the file as it is later) is what the width check, the rehearsal and the loader
use. Here the file is rewritten the moment that first reading is done (another width, another
normalization, no ``b_dec`` on the way in): the run still refuses nothing and records the features the
original ``cfg.json`` makes, computed by hand from the weights."""
from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file

import hooks.types.sae
from conftest import make_config, run
from runner.analysis import load_tensors
from sae_folders import random_saelens

LAYER = "transformer.h.0"
#: What the rewritten ``cfg.json`` says: each would change the run's width check or its features if read again.
REWRITTEN = {"d_in": 16, "normalize_activations": "layer_norm", "apply_b_dec_to_input": False}


def test_a_cfg_json_edited_after_the_check_cannot_change_the_sae_the_run_splices(tmp_path, monkeypatch):
    """Catches a run that reads ``cfg.json`` again after the entry checked it (an entry built anew for the run,
    the width check or the loader reading the file): with ``d_in=16`` it would refuse the 32-wide block, with
    ``layer_norm`` and no ``b_dec`` its features would not be ``relu((x - b_dec) W_enc + b_enc)``."""
    folder = random_saelens(tmp_path / "sae", 32, d_sae=6)
    checked = hooks.types.sae.check_saelens

    def check_then_rewrite(path: str, key: str) -> dict:
        cfg = checked(path, key)
        (folder / "cfg.json").write_text(json.dumps({**cfg, **REWRITTEN}))
        return cfg

    monkeypatch.setattr(hooks.types.sae, "check_saelens", check_then_rewrite)
    overrides = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2", "hooks=[sae,extract]",
                 f"hooks.sae.layers={LAYER}", f"hooks.sae.path={folder}", f"hooks.extract.layers=[{LAYER},{LAYER}.sae]")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    assert json.loads((folder / "cfg.json").read_text())["d_in"] == 16  # the file did change under the run

    kept = load_tensors(out).sort_values("step")
    blocks = torch.from_numpy(np.concatenate(list(kept[kept.layer == LAYER].tensor))).double()
    features = np.concatenate(list(kept[kept.layer == f"{LAYER}.sae"].tensor))
    w = {name: t.double() for name, t in load_file(folder / "sae_weights.safetensors").items()}
    by_hand = torch.relu((blocks - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    assert features.shape == (4, 16, 6)  # 2 steps of 2 samples, 16 positions, d_sae features
    np.testing.assert_allclose(features, by_hand.numpy(), rtol=0, atol=1e-5)
    assert 0 < (by_hand > 0).double().mean() < 1  # some features fire, some do not
