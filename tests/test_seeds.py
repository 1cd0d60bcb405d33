"""The tutorials' hooks that no preset expresses (``examples.seed_hooks``, through ``type: custom``,
``mode: custom``, ``min_bytes`` and ``max_calls``), each against the same hook written by hand on
the same weights and input. Each test's overrides are the README's command line for it."""
from __future__ import annotations

import os
import tempfile
import uuid

import pytest
import torch

import runner.analysis as analysis
from conftest import hook_count, seeded_batch, stats_of
from examples import seed_hooks
from models_for_tests import KwargsNet
from runner.sources.models import MLP

pytestmark = pytest.mark.statistics

PAIRS = {
    "print": ("print_packing", "print_unpacking"),
    "times_four": ("times_four", "quarter"),
    "list_index": ("store_in_list", "load_from_list"),
}


def hand_written_mlp_grads(pack, unpack) -> tuple[dict[str, torch.Tensor], int]:
    """The MLP the runner builds (seed 0), its forward under ``saved_tensors_hooks(pack, unpack)``:
    the parameter gradients and how many tensors were packed."""
    torch.manual_seed(0)
    model = MLP()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: packed.append(1) or pack(x), unpack):
        out = model(seeded_batch([1, 100]))
    out.sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}, len(packed)


def assert_grads_recorded(run_dir, grads: dict[str, torch.Tensor]) -> None:
    rows = stats_of(run_dir, hook="post_accumulate")
    assert len(rows) == len(grads)
    for row in rows.itertuples():
        grad = grads[f"{row.layer}.{row.slot}"].double()
        assert row.l2 == pytest.approx(grad.norm().item(), rel=1e-6)
        assert row.mean == pytest.approx(grad.mean().item(), rel=1e-6, abs=1e-9)
        assert (row.min, row.max) == (grad.min().item(), grad.max().item())


@pytest.mark.parametrize("pair", PAIRS)
def test_custom_pack_unpack_pairs_match_hand_written(run_with, capsys, pair):
    pack, unpack = (getattr(seed_hooks, name) for name in PAIRS[pair])
    seed_hooks.STORAGE.clear()
    run_dir = run_with("model=mlp", "hooks=[offload,post_accumulate]", "hooks.offload.mode=custom",
                       f"hooks.offload.pack=examples.seed_hooks.{PAIRS[pair][0]}",
                       f"hooks.offload.unpack=examples.seed_hooks.{PAIRS[pair][1]}")
    ours = capsys.readouterr().out
    stored = len(seed_hooks.STORAGE)
    seed_hooks.STORAGE.clear()
    grads, n_packed = hand_written_mlp_grads(pack, unpack)
    assert ours == capsys.readouterr().out  # the same lines, e.g. "packing: tensor(...)" per saved tensor
    assert stored == len(seed_hooks.STORAGE)
    assert_grads_recorded(run_dir, grads)
    saved = stats_of(run_dir, hook="offload")
    assert (saved.kind == "saved").all() and len(saved) == n_packed > 0
    if pair == "times_four":  # recorded as packed: 4x what autograd saved, printed as the tutorial does
        starts = [line.split(":")[0] for line in ours.splitlines() if "packing:" in line]
        assert starts.count("packing") == starts.count("unpacking") == n_packed


class SelfDeletingTempFile:
    """The tutorial's file handle: deleted when autograd drops it."""

    def __init__(self, directory: str) -> None:
        self.name = os.path.join(directory, str(uuid.uuid4()))

    def __del__(self) -> None:
        os.remove(self.name)


def test_offload_to_disk_above_a_threshold_matches_the_tutorial(run_with, monkeypatch, tmp_path):
    saves = []
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: saves.append(obj.numel()) or save(obj, f, *a, **k))
    run_dir = run_with("model=mlp", "hooks=[offload,post_accumulate]", "hooks.offload.mode=offload_disk",
                       "hooks.offload.min_bytes=4000", f"hooks.offload.directory={tmp_path}")
    ours, saves[:] = list(saves), []

    threshold = 1000  # SAVE_ON_DISK_THRESHOLD, in elements: 1000 float32 = 4000 bytes
    directory = tempfile.mkdtemp(dir=tmp_path)

    def pack_hook(x):
        if x.numel() < threshold:
            return x
        temp_file = SelfDeletingTempFile(directory)
        torch.save(x, temp_file.name)
        return temp_file

    def unpack_hook(tensor_or_sctf):
        if isinstance(tensor_or_sctf, torch.Tensor):
            return tensor_or_sctf
        return torch.load(tensor_or_sctf.name)

    grads, _ = hand_written_mlp_grads(pack_hook, unpack_hook)
    assert ours == saves == [1000]  # fc2's weight went to disk (fc1's is not saved: x needs no grad)
    assert len(stats_of(run_dir, hook="offload")) > len(ours)  # the small activations stayed where they were
    assert_grads_recorded(run_dir, grads)


def test_forward_hook_reading_kwargs_matches_hand_written(run_with):
    run_dir = run_with("model=custom", "model._target_=models_for_tests.KwargsNet", "data.shape=[2,3]", "loss=none",
                       "+hooks.kw={type:custom,layers:scale,fn:examples.seed_hooks.add_factor_kwarg,with_kwargs:true}",
                       "+hooks.out={type:capture,layers:'',kinds:[output]}")
    net = KwargsNet.instances[-1]
    handle = net.scale.register_forward_hook(seed_hooks.add_factor_kwarg, with_kwargs=True)
    with torch.no_grad():
        expected = net(seeded_batch([2, 3]))
    handle.remove()
    got = analysis.load_tensors(run_dir).set_index("hook").loc["out", "tensor"]
    assert torch.equal(torch.from_numpy(got), expected)


def test_hook_removed_after_n_calls_matches_hand_written(run_with, capsys):
    run_dir = run_with("model=mlp", "steps=3", "hooks=custom", "hooks.custom.layers=fc1", "hooks.custom.max_calls=1")
    ours = capsys.readouterr().out
    torch.manual_seed(0)
    model = MLP()
    calls = 0

    def once(module, inputs, output):
        nonlocal calls
        seed_hooks.print_layer(module, inputs, output)
        calls += 1
        if calls == 1:
            handle.remove()

    handle = model.fc1.register_forward_hook(once)
    gen = torch.Generator().manual_seed(0)  # the runner's data: one seeded generator, one batch per step
    for _ in range(3):
        model(torch.randn([1, 100], generator=gen)).sum().backward()
    assert ours == capsys.readouterr().out and ours.count("layer: Linear") == 1
    rows = stats_of(run_dir, hook="custom")
    assert list(rows.step) == [0] and list(rows.kind) == ["output"]
    assert hook_count(model) == 0


# -- seed examples that presets express, not covered by tests/test_tutorials.py ------------------
def test_clip_affine_relu_affine_matches_hand_written(run_with):
    """Seed 003's ``clip_grad(model, floor=-1, cap=1)`` on AffineReluAffine(100, 200, 5) (= model=mlp)."""
    run_dir = run_with("model=mlp", "hooks=clip", "hooks.clip.min=-1", "hooks.clip.max=1")
    torch.manual_seed(0)
    model = MLP()
    for p in model.parameters():
        p.register_hook(lambda grad: grad.clamp_(-1, 1))
    model(seeded_batch([1, 100])).sum().backward()
    assert torch.equal(model.fc2.bias.grad, torch.ones(5))  # the tutorial's tensor([1., 1., 1., 1., 1.])
    final = stats_of(run_dir, phase="after_backward", kind="param_grad").set_index(["layer", "slot"])
    for name, p in model.named_parameters():
        row = final.loc[tuple(name.rsplit(".", 1))]
        assert (row["min"], row["max"]) == (p.grad.min().item(), p.grad.max().item())
        assert row.l2 == pytest.approx(p.grad.double().norm().item(), rel=1e-6)


def test_save_output_on_every_conv2d_of_resnet34_matches_hand_written(run_with):
    """Seed 001's ``SaveOutput`` on each ``Conv2d`` of resnet34: 36 outputs, the first kept."""
    run_dir = run_with("model=resnet34", "data.shape=[2,3,32,32]", "loss=none", "hooks=extract",
                       "hooks.extract.layers=type:Conv2d")
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet34()
    outputs = []
    for layer in model.modules():
        if isinstance(layer, torch.nn.Conv2d):
            layer.register_forward_hook(lambda m, i, out: outputs.append(out.detach()))
    with torch.no_grad():
        model(seeded_batch([2, 3, 32, 32]))
    tensors = analysis.load_tensors(run_dir)
    assert len(outputs) == len(tensors) == 36
    assert torch.equal(torch.from_numpy(tensors.set_index("layer").loc["conv1", "tensor"]), outputs[0])
