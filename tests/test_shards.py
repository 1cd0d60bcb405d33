"""``hooks.mechanism.shards``: a tensor's statistics from its shards' reductions, and what the C kernel may read."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from hooks.kernels import native
from hooks.mechanism import shards
from hooks.kernels.stats import reduce_tensor, summarize

pytestmark = pytest.mark.statistics


@pytest.mark.parametrize("sizes", [(7, 5, 0, 12), (1, 23), (24,)], ids=["uneven-with-empty", "one-and-rest", "one"])
def test_merged_shard_reductions_give_the_whole_tensors_statistics(sizes):
    torch.manual_seed(0)
    whole = torch.cat([torch.randn(24) * 3 + 100, torch.zeros(0)])
    whole[[2, 9]] = 0.0
    pieces = torch.split(whole, list(sizes))
    merged = shards.merge(np.stack([reduce_tensor(p).numpy() for p in pieces]), np.array(sizes, dtype=float))
    got = summarize(merged[None], np.array([whole.numel()]))
    x = whole.double()
    want = {"mean": x.mean(), "std": x.std(), "min": x.min(), "max": x.max(), "abs_mean": x.abs().mean(),
            "l2": x.norm(), "zero_frac": (x == 0).double().mean()}
    for name, value in want.items():
        assert got[name][0] == pytest.approx(value.item(), rel=1e-6), name


def test_a_nan_in_one_shard_is_the_whole_tensors_nan():
    whole = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    merged = shards.merge(np.stack([reduce_tensor(p).numpy() for p in whole.split(2)]), np.array([2.0, 2.0]))
    got = summarize(merged[None], np.array([4]))
    assert np.isnan(got["mean"][0]) and np.isnan(got["max"][0]) and got["nan_count"][0] == 1


def test_the_kernel_never_reads_a_tensor_whose_storage_was_freed():
    t = torch.randn(16)
    t.untyped_storage().resize_(0)  # what FSDP2 does to an unsharded parameter between uses
    with pytest.raises(ConfigError, match=r"storage holds 0 of its 64 bytes") as info:
        reduce_tensor(t)
    assert "\n" not in str(info.value)


def test_a_tensor_subclass_takes_the_eager_reductions():
    class Wrapped(torch.Tensor):
        pass

    t = torch.randn(100).as_subclass(Wrapped)
    assert not native.readable(t)
    got = summarize(reduce_tensor(t).numpy()[None], np.array([100]))
    x = t.as_subclass(torch.Tensor).double()
    for name, value in {"mean": x.mean(), "std": x.std(), "l2": x.norm(), "max": x.max()}.items():
        assert got[name][0] == pytest.approx(value.item(), rel=1e-6), name


@pytest.fixture
def one_rank_mesh(tmp_path):
    """FSDP2 on a process group of one (gloo, in this process): its parameters are DTensors."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_a_sharded_parameters_clip_matches_a_hand_clamped_gradient(one_rank_mesh, tmp_path):
    import runner
    import runner.analysis as analysis
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    plain, model = build(), fully_shard(build(), mesh=one_rank_mesh)
    x = torch.randn(4, 8)
    plain(x).sum().backward()
    with runner.attach(model, hooks={"clip": {"type": "clamp", "layers": "**", "max": 0.01}}, out_dir=tmp_path / "run") as run:
        loss = model(x).sum()
        run.backward(loss)
        run.step(loss)
    rows = analysis.load_stats(tmp_path / "run")
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        want = q.grad.clamp(max=0.01)
        torch.testing.assert_close(p.grad.full_tensor(), want)
        layer, slot = name.split(".")
        here = rows[(rows.layer == layer) & (rows.slot == slot) & (rows.phase == "backward")]
        got, clipped = here[here.kind == "param_grad"], here[here.kind == "clipped"]
        assert len(got) == 1 and got["mean"].iloc[0] == pytest.approx(want.double().mean().item(), rel=1e-5, abs=1e-8)
        removed = (q.grad - want).double()  # what the clamp took away, the whole tensor's
        assert len(clipped) == 1 and clipped["l2"].iloc[0] == pytest.approx(removed.norm().item(), rel=1e-5, abs=1e-8)


def test_an_edit_of_a_sharded_gradient_accumulated_over_two_backwards_is_one_line(one_rank_mesh, tmp_path):
    import runner
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 3)), mesh=one_rank_mesh)
    with pytest.raises(ConfigError, match=r"hooks.clip: a sharded \(FSDP2\) parameter's .grad was accumulated over "
                                          r"two backward passes") as info:
        with runner.attach(model, hooks=["clip"], out_dir=tmp_path / "run") as run:
            for _ in range(2):
                run.backward(model(torch.randn(4, 8)).sum())
    assert "\n" not in str(info.value)
