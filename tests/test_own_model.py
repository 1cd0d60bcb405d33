"""``model=hf model.path=DIR`` (a ``save_pretrained`` directory, offline) and ``.safetensors`` checkpoints."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from conftest import make_config, stats_of
from common.errors import ConfigError
from runner.engine.plan import compile_plan
from runner.sources.models import ConvNet, build_model

pytestmark = pytest.mark.statistics

transformers = pytest.importorskip("transformers", reason="the 'transformers' extra is not installed")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A 2-block GPT-2 with random weights (no dropout) saved as a Hugging Face directory."""
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(3)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, use_cache=False,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_a_saved_model_loads_offline_and_its_hooks_match_hand_written_ones(run_with, gpt2_dir):
    run_dir = run_with("model=hf", f"model.path={gpt2_dir}", "data=tokens", "hooks=stats",
                       r"hooks.stats.layers=re:transformer\.h\.\d+\.mlp")
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True).train()
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))  # data=tokens, seed 0
    seen = {}
    for i, block in enumerate(model.transformer.h):
        def keep(_m, _i, out, name=f"transformer.h.{i}.mlp"):
            seen[(name, "output")] = out.detach().clone()
            out.register_hook(lambda g: seen.__setitem__((name, "grad_output"), g.clone()))
        block.mlp.register_forward_hook(keep)
    model(tokens).logits.sum().backward()
    rows = stats_of(run_dir, hook="stats")
    assert len(rows) == 4 == len(seen)
    for row in rows.itertuples():
        assert row.l2 == pytest.approx(seen[(row.layer, row.kind)].double().norm().item(), rel=1e-5)


def test_auto_picks_the_class_and_num_classes_follows_config_json(gpt2_dir):
    plan = compile_plan(make_config("model=hf", f"model.path={gpt2_dir}", "model.auto=model", "data=tokens"))
    assert plan.model.num_classes == 100 and type(build_model(plan.model)).__name__ == "GPT2Model"


@pytest.mark.parametrize("overrides, message", [
    ((), "model.path: required for model=hf, e.g. model.path=DIR"),
    (("model.path=/nonexistent/gpt",), "model.path: no directory at '/nonexistent/gpt'"),
    (("model.path={empty}",), "model.path: '{empty}' has no config.json"),
    (("model.path={empty}", "model.auto=causallm"),
     "model.auto: unknown Auto class 'causallm'; valid: causal_lm, masked_lm, model, sequence_classification; "
     "did you mean 'causal_lm'?"),
    (("model.path={empty}", "+model.pth=x"), "model.pth: unknown key for model 'hf' 'pth'"),
])
def test_hf_mistakes_are_one_line(tmp_path, overrides, message):
    overrides = [o.format(empty=tmp_path) for o in overrides]
    with pytest.raises(ConfigError) as err:
        compile_plan(make_config("model=hf", "data=tokens", *overrides))
    assert message.format(empty=tmp_path) in str(err.value) and len(str(err.value).splitlines()) == 1


def _saved_convnet(path, **changes) -> dict[str, torch.Tensor]:
    torch.manual_seed(11)
    state = {**ConvNet().state_dict(), **changes}
    save_file({k: v for k, v in state.items() if v is not None}, path)
    return state


def test_a_safetensors_checkpoint_is_loaded(tmp_path):
    saved = _saved_convnet(tmp_path / "w.safetensors")
    plan = compile_plan(make_config("model=convnet", f"model.checkpoint={tmp_path / 'w.safetensors'}"))
    model = build_model(plan.model)
    assert torch.equal(model.fc.weight, saved["fc.weight"]) and torch.equal(model.conv.bias, saved["conv.bias"])
    torch.manual_seed(0)
    assert not torch.equal(ConvNet().fc.weight, saved["fc.weight"])  # not what the run's seed builds


@pytest.mark.parametrize("changes, message", [
    ({"fc.bias": None}, 'Missing key(s) in state_dict: "fc.bias"'),
    ({"fc.weight": torch.zeros(5, 7)}, "size mismatch for fc.weight"),
])
def test_a_safetensors_file_that_does_not_fit_is_one_line_naming_it(run_with, tmp_path, changes, message):
    path = tmp_path / "w.safetensors"
    _saved_convnet(path, **changes)
    with pytest.raises(ConfigError) as err:
        run_with("model=convnet", f"model.checkpoint={path}")
    text = str(err.value)
    assert text.startswith(f"model.checkpoint: '{path}' does not fit the model: ") and message in text
    assert len(text.splitlines()) == 1


def test_a_corrupt_safetensors_file_is_one_line(run_with, tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(ConfigError, match=f"^model.checkpoint: cannot read '{path}' as a weights-only state_dict: "):
        run_with("model=convnet", f"model.checkpoint={path}")
