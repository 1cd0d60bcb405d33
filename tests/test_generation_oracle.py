"""Oracle: steered generation equals nnsight's (``LanguageModel.generate`` with the block's output edited at
every generation step) on the same saved tiny GPT-2 (``test_generation.gpt2``), token for token. nnsight is
used only here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_config, run
from test_generation import LAYER, NEW, PROMPTS, by_hand, generated, gpt2, saved, text  # noqa: F401 (fixtures)

pytestmark = pytest.mark.oracles


@pytest.mark.parametrize("scale", [0.3, 1.0])
def test_steered_generation_equals_nnsight_s_token_for_token(tmp_path, saved, text, scale):  # noqa: F811
    from nnsight import LanguageModel

    values = np.random.default_rng(3).standard_normal(32)
    np.save(tmp_path / "v.npy", values)
    overrides = (*text, "hooks=steer", f"hooks.steer.layers={LAYER}", f"hooks.steer.file={tmp_path / 'v.npy'}",
                 "hooks.steer.baseline=false", f"hooks.steer.scale={scale}")
    ours = generated(run(make_config(*overrides), tmp_path / "run", overrides))
    assert max(map(len, ours)) == NEW  # nnsight's loop below runs NEW steps
    assert ours != by_hand(gpt2(), do_sample=False)  # the steering changed the text

    model = LanguageModel(str(saved), dispatch=True, tokenizer_kwargs={"padding_side": "left"})
    vector = torch.from_numpy(values).float()
    block = model.transformer.h[int(LAYER.rsplit(".", 1)[1])]
    with model.generate(PROMPTS, max_new_tokens=NEW, do_sample=False, pad_token_id=0) as tracer:
        for _ in tracer.iter[0:NEW]:  # the prompt's forward, then each new token's
            block.output = block.output + scale * vector
        ids = tracer.result.save()
    width = model.tokenizer(PROMPTS, padding=True, return_tensors="pt")["input_ids"].shape[1]
    rows = ids[:, width:].tolist()
    assert ours == [row[:row.index(0) + 1] if 0 in row else row for row in rows]
