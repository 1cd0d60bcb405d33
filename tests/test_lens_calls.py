"""The logit lens's own ``ln_f`` and ``lm_head`` calls are its own: beside a ``logit_lens`` entry, an entry on
either module sees the model's calls only, numbered as in a run without the lens. A ``patch`` from a stored
run made without the lens gives what the same patch written by hand in plain PyTorch gives, and the lens
reads each block's output through the unpatched modules."""
from __future__ import annotations

import pytest
import torch

import runner
import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis.lens import load_lens
from runner.engine.plan import compile_plan
from runner.sources.models import gpt2_tiny

GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2")
POSITION = 15  #: the position the patch puts the stored value in (``index`` 15: dim 1 of [batch, positions, ...])


def batches(*overrides: str) -> list[torch.Tensor]:
    """The two steps' token batches of a run with ``overrides``, made as the run makes them."""
    data = compile_plan(make_config(*GPT2, *overrides)).data.batches(0, torch.device("cpu"))
    return [next(data).x for _ in range(2)]


def by_hand(layer: str) -> list[dict]:
    """Per step: the stored run's output of ``layer`` (seed 0), then the seed-1 pass with that output put in at
    ``POSITION`` by a plain forward hook: the logits, and each block's output through ``ln_f`` and ``lm_head``."""
    torch.manual_seed(0)
    model = gpt2_tiny().eval()
    module = model.get_submodule(layer)
    steps = []
    with torch.no_grad():
        for clean_x, x in zip(batches(), batches("data.seed=1")):
            stored = {}
            handle = module.register_forward_hook(lambda m, a, out: stored.setdefault("out", out))
            model(clean_x)
            handle.remove()

            def patch(m, args, out):
                new = out.clone()
                new[:, POSITION] = stored["out"][:, POSITION]
                return new

            blocks = {}
            handles = [module.register_forward_hook(patch)] + [
                block.register_forward_hook(lambda m, a, out, i=i: blocks.__setitem__(i, out[0] if isinstance(out, tuple) else out))
                for i, block in enumerate(model.transformer.h)]
            logits = model(x).logits
            for h in handles:
                h.remove()
            lens = {i: model.lm_head(model.transformer.ln_f(h)).double() for i, h in blocks.items()}
            steps.append({"logits": logits, "lens": lens})
    return steps


@pytest.mark.parametrize("layer", ["lm_head", "transformer.ln_f"])
def test_a_stored_run_patch_beside_the_lens_is_the_hand_written_patch_at_the_model_s_call(tmp_path, layer):
    keep = ("hooks=extract", "hooks.extract.layers=[lm_head,transformer.ln_f]")
    stored = run(make_config(*GPT2, *keep), tmp_path / "stored", GPT2 + keep)  # made without the lens
    overrides = ("data.seed=1", "hooks=[logit_lens,patch,extract]", "hooks.logit_lens.top_k=3",
                 f"hooks.patch.source={stored}", f"hooks.patch.layers={layer}", f"hooks.patch.index={POSITION}",
                 "hooks.extract.layers=lm_head")
    out = run(make_config(*GPT2, *overrides), tmp_path / "out", GPT2 + overrides)
    hand = by_hand(layer)

    kept = analysis.load_tensors(out)
    kept = kept[(kept.hook == "extract") & (kept.layer == "lm_head")]
    assert sorted(zip(kept.step, kept.call)) == [(0, 0), (1, 0)]  # one call per step: the model's
    for row in kept.itertuples():
        torch.testing.assert_close(torch.from_numpy(row.tensor), hand[row.step]["logits"], rtol=0, atol=1e-6)
    assert not torch.allclose(hand[0]["logits"][:, POSITION], by_hand_unpatched_position(), atol=1e-3)
    stats = analysis.load_stats(out)
    patched = stats[(stats.hook == "patch") & (stats.kind == "patched")]
    assert sorted(zip(patched.step, patched.call)) == [(0, 0), (1, 0)]

    lens = load_lens(out)
    assert len(lens) == 2 * 2 * 2 * 16  # steps x blocks x samples x positions
    for row in lens.itertuples():
        logits = hand[row.step]["lens"][row.block][row.sample % 2, row.position]
        assert list(row.top_ids) == logits.topk(3).indices.tolist()
        assert row.target == int(hand[row.step]["logits"][row.sample % 2, row.position].argmax())
        assert row.target_logit == pytest.approx(float(logits[row.target]), rel=1e-6)


def by_hand_unpatched_position() -> torch.Tensor:
    """Step 0's logits at ``POSITION`` of the seed-1 batch without any patch (the patch must change them)."""
    torch.manual_seed(0)
    with torch.no_grad():
        return gpt2_tiny().eval()(batches("data.seed=1")[0]).logits[:, POSITION]


def untied_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    model = gpt2_tiny().eval()
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # FSDP2 can shard it alone
    return model


def test_the_lens_reads_through_an_unembedding_fsdp2_shards_on_its_own(tmp_path):
    """``lm_head`` in an FSDP2 group of its own is sharded while the blocks run: the lens gathers it for its
    reading (one rank, gloo, in this process) and gives the unsharded model's lens."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    x = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(3))
    plain, blocks = untied_gpt2(), {}
    for i, block in enumerate(plain.transformer.h):
        block.register_forward_hook(lambda m, a, out, i=i: blocks.__setitem__(i, out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        plain(x)
        hand = {i: plain.lm_head(plain.transformer.ln_f(h)).double() for i, h in blocks.items()}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh, model = init_device_mesh("cpu", (1,)), untied_gpt2()
        for module in [*model.transformer.h, model.lm_head]:
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with runner.attach(model, hooks=["logit_lens"], overrides=["hooks.logit_lens.top_k=3"],
                           out_dir=tmp_path / "run") as run:
            with torch.no_grad():
                model(x)
            run.step()
    finally:
        dist.destroy_process_group()
    lens = load_lens(tmp_path / "run")
    assert len(lens) == 2 * 2 * 16
    for row in lens.itertuples():
        logits = hand[row.block][row.sample, row.position]
        assert list(row.top_ids) == logits.topk(3).indices.tolist()
        assert row.target_logit == pytest.approx(float(logits[row.target]), rel=1e-5)
