"""A Hugging Face GPT-2 built offline: keyword inputs, dict-like outputs, pattern selectors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import runner.analysis as analysis
from conftest import run, stats_of

pytestmark = pytest.mark.statistics

pytest.importorskip("transformers", reason="the 'transformers' extra is not installed (pip install -e '.[transformers]')")

from runner.sources.models import gpt2_tiny  # noqa: E402

MODEL = ["model=gpt2_tiny", "data=tokens"]


def hand_model_and_tokens():
    torch.manual_seed(0)
    model = gpt2_tiny()
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, tokens


def test_pattern_selects_every_mlp_and_matches_hand_written_hooks(run_with):
    run_dir = run_with(*MODEL, "hooks=stats", r"hooks.stats.layers=re:transformer\.h\.\d+\.mlp")
    model, tokens = hand_model_and_tokens()
    seen = {}
    for i, block in enumerate(model.transformer.h):
        def keep(_m, _i, out, i=i):
            seen[(f"transformer.h.{i}.mlp", "output")] = out.detach().clone()
            out.register_hook(lambda g: seen.__setitem__((f"transformer.h.{i}.mlp", "grad_output"), g.clone()))
        block.mlp.register_forward_hook(keep)
    model(tokens).logits.sum().backward()
    rows = stats_of(run_dir, hook="stats")
    assert sorted(set(rows.layer)) == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    for row in rows.itertuples():
        t = seen[(row.layer, row.kind)].double()
        assert row.l2 == pytest.approx(t.norm().item(), rel=1e-5)
        assert row.max == pytest.approx(t.max().item(), rel=1e-5)


def test_keyword_inputs_of_blocks_are_captured_with_kwargs(run_with):
    run_dir = run_with(*MODEL, "loss=none", "hooks=extract", "hooks.extract.layers=transformer.h.0",
                       "hooks.extract.kinds=[input]")
    model, tokens = hand_model_and_tokens()
    captured = {}

    def pre(_m, args, kwargs):
        captured["0"] = args[0].detach().clone()
        captured["position_ids"] = kwargs["position_ids"].clone()

    model.transformer.h[0].register_forward_pre_hook(pre, with_kwargs=True)
    with torch.no_grad():
        model(tokens)
    got = analysis.load_tensors(run_dir).set_index("slot")
    assert set(got.index) == {"0", "position_ids"}  # None and bool arguments are skipped
    np.testing.assert_array_equal(got.loc["0", "tensor"], captured["0"].numpy())
    np.testing.assert_array_equal(got.loc["position_ids", "tensor"], captured["position_ids"].numpy())
    assert got.loc["position_ids", "dtype"] == "int64"


def test_dict_like_model_output_is_walked_by_key(run_with):
    run_dir = run_with(*MODEL, "loss=none", "hooks=stats", "hooks.stats.layers=''", "hooks.stats.kinds=[output]")
    assert stats_of(run_dir).slot.tolist() == ["logits"]


def test_tokens_model_without_token_data_is_a_one_line_error(tmp_path):
    from conftest import make_config
    from common.errors import ConfigError
    
    with pytest.raises(ConfigError, match=r"this model takes token ids \(integers\), but data=randn gives torch.float32 \[2, 16\]; use data=tokens"):
        run(make_config("model=gpt2_tiny"), tmp_path / "out")
