"""Device handling of captures: host copies that do not stall the device, one transfer per step.

The CPU tests cover the recorder's logic (independent copies, one wait per step); the CUDA test
checks the device path itself and runs only where a GPU exists.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.errors import ConfigError
from hooks.mechanism.recorder import HostCopies, Recorder
from conftest import make_config
from runner.engine.plan import compile_plan


def record_layers(recorder: Recorder, tensors: list[torch.Tensor]) -> None:
    for i, t in enumerate(tensors):
        recorder.record(t, hook="h", layer=f"l{i}", phase="forward", kind="output", slot="0", call=0, keep=True)


def test_kept_cpu_tensors_are_independent_copies_and_drain_waits_once(monkeypatch):
    waits = []
    monkeypatch.setattr(HostCopies, "wait", lambda self: waits.append(set(self.in_flight)))
    recorder = Recorder()
    xs = [torch.randn(4, 3, requires_grad=True) * 1 for _ in range(5)]
    record_layers(recorder, xs)
    with torch.no_grad():
        for x in xs:
            x.relu_()  # what ReLU(inplace=True) does after the hook returned
    captures = recorder.drain()
    assert waits == [set()]  # one wait per step, nothing in flight on the CPU
    for kept, x in zip(captures.kept, xs):
        assert kept.grad_fn is None and not kept.requires_grad
        assert kept.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert (kept < 0).any() and not torch.equal(kept, x.detach())
    assert captures.stats["min"].max() < 0  # statistics of the values the hook saw


def test_device_choice_follows_the_machine():
    assert compile_plan(make_config("model=linear", "device=cpu")).device == "cpu"
    assert compile_plan(make_config("model=linear", "device=auto")).device == (
        "cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_is_refused_here_but_left_to_the_node_for_remote_jobs():
    with pytest.raises(ConfigError, match="device: cuda requested but torch.cuda.is_available"):
        compile_plan(make_config("model=linear", "device=cuda"))
    assert compile_plan(make_config("model=linear", "device=cuda"), check_device=False).device == "cuda"


class DeviceToHost(TorchDispatchMode):
    """Counts operations that copy from the GPU to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            if isinstance(out, torch.Tensor) and out.device.type == "cpu" and src.device.type == "cuda":
                self.copies += 1
        return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_cuda_captures_copy_without_syncing_and_stats_transfer_once():
    recorder = Recorder()
    xs = [torch.randn(64, 32, device="cuda") for _ in range(8)]
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call in the hook path raises
    try:
        with DeviceToHost() as counted:
            record_layers(recorder, xs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert counted.copies == len(xs)  # the kept copies, each non-blocking into pinned memory
    assert recorder.host.in_flight == {xs[0].device}
    with DeviceToHost() as counted:
        captures = recorder.drain()
    assert counted.copies == 1  # every layer's statistics in one transfer
    assert not recorder.host.in_flight
    for kept, x in zip(captures.kept, xs):
        assert kept.is_pinned() and torch.equal(kept, x.cpu())
    torch.testing.assert_close(torch.tensor(captures.stats["mean"]),
                               torch.stack([x.double().mean().cpu() for x in xs]), rtol=1e-6, atol=1e-9)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_slurm_sweep_leaves_cuda_to_the_jobs_node_a_local_run_does_not():
    from runner.cli.commandline import check_command_line

    assert check_command_line(["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "model=convnet",
                               "device=cuda", "hooks=clip"]).problems == []
    assert check_command_line(["model=convnet", "device=cuda", "hooks=clip"]).problems == [
        "device: cuda requested but torch.cuda.is_available() is False; use device=cpu or auto"]
