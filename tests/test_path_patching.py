"""Path-restricted patching (``hooks.patch.receiver``) against a hand-written two-pass loop on gpt2_tiny."""
from __future__ import annotations

import pytest
import torch

import runner.analysis as analysis
from common.errors import ConfigError
from conftest import make_config
from runner.engine.plan import compile_plan
from runner.sources.models import gpt2_tiny
from test_interventions import GPT, kept, tokens

THREE = (*GPT, "model.n_layer=3")


def hand_path_patched(sender: int, receiver: int, position: int | None,
                      n_layer: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of gpt2_tiny (``n_layer`` blocks) on the corrupted tokens with what block ``sender`` sends block
    ``receiver`` patched, by a plain two-pass loop: the clean pass keeps the sender's output; in the
    corrupted pass the sender's output stays as it is, and the receiver's input (the residual stream)
    gets ``clean - corrupted`` sender output added (at ``position``, or everywhere). Also the plain
    corrupted logits."""
    torch.manual_seed(0)
    model = gpt2_tiny(n_layer=n_layer).eval()
    blocks = model.transformer.h
    kept_out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        handle = blocks[sender].register_forward_hook(lambda m, a, out: kept_out.__setitem__("clean", out))
        model(tokens(0))
        handle.remove()
        corrupted = model(tokens(1)).logits
        handle = blocks[sender].register_forward_hook(lambda m, a, out: kept_out.__setitem__("corrupted", out))

        def add(module, args):
            delta = kept_out["clean"] - kept_out["corrupted"]
            if position is not None:
                only = torch.zeros_like(delta)
                only[:, position] = delta[:, position]
                delta = only
            return (args[0] + delta, *args[1:])

        blocks[receiver].register_forward_pre_hook(add)
        patched = model(tokens(1)).logits
        handle.remove()
    return patched, corrupted


@pytest.mark.parametrize("source", ["clean", "stored"])
def test_a_path_patch_from_block_0_to_block_2_equals_the_hand_written_two_pass_loop(run_with, source):
    where = run_with(*THREE, "hooks=extract", "hooks.extract.layers=transformer.h.0") if source == "stored" else "clean"
    out = run_with(*THREE, "data.seed=1", "hooks=[patch,extract]", f"hooks.patch.source={where}",
                   "hooks.patch.layers=transformer.h.0", "hooks.patch.receiver=transformer.h.2",
                   "hooks.patch.index=15", "hooks.extract.layers=lm_head")
    patched, corrupted = hand_path_patched(0, 2, 15)
    assert torch.equal(kept(out, "lm_head"), patched) and not torch.equal(patched, corrupted)
    rows = analysis.load_stats(out)
    put = rows[(rows.hook == "patch") & (rows.kind == "patched")]
    assert list(put.layer) == ["transformer.h.2"] and list(put.tensor_shape) == [(2, 1, 32)]  # what was added there
    # block 1 read the corrupted block 0 output: the path is not the whole patch
    whole = run_with(*THREE, "data.seed=1", "hooks=[patch,extract]", f"hooks.patch.source={where}",
                     "hooks.patch.layers=transformer.h.0", "hooks.patch.index=15", "hooks.extract.layers=lm_head")
    assert not torch.allclose(kept(whole, "lm_head"), patched, atol=1e-6)


def test_a_path_to_the_next_block_is_the_whole_patch(run_with):
    """The next block reads the sender's output itself: corrupted + (clean - corrupted) is the clean value."""
    path = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", "hooks.patch.source=clean",
                    "hooks.patch.layers=transformer.h.0", "hooks.patch.receiver=transformer.h.1",
                    "hooks.extract.layers=lm_head")
    whole = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", "hooks.patch.source=clean",
                     "hooks.patch.layers=transformer.h.0", "hooks.extract.layers=lm_head")
    torch.testing.assert_close(kept(path, "lm_head"), kept(whole, "lm_head"))


def test_a_receiver_before_its_sender_is_one_line_and_the_run_writes_nothing(run_with, tmp_path):
    with pytest.raises(ConfigError, match=r"^hooks.patch.receiver: 'transformer.h.0' ran before the senders "
                                          r"\(transformer.h.1\) in step 0; a path runs from them to a later module$"):
        run_with(*GPT, "data.seed=1", "hooks=patch", "hooks.patch.source=clean",
                 "hooks.patch.layers=transformer.h.1", "hooks.patch.receiver=transformer.h.0")
    assert not (tmp_path / "run0" / "manifest.json").exists()


@pytest.mark.parametrize("receiver, message", [
    ("transformer.h.9", r"^hooks.patch.receiver: .*transformer.h.9"),
    ("transformer.h.*", r"^hooks.patch.receiver: 'transformer.h.\*' matches 2 modules \(transformer.h.0, "
                        r"transformer.h.1\); a path has one receiver$"),
    ("transformer.h.0", r"^hooks.patch.receiver: 'transformer.h.0' is also a sender"),
])
def test_a_bad_receiver_is_one_line_before_the_run(receiver, message):
    with pytest.raises(ConfigError, match=message):
        compile_plan(make_config(*GPT, "hooks=patch", "hooks.patch.source=clean", "hooks.patch.layers=transformer.h.0",
                                 f"hooks.patch.receiver={receiver}"))
