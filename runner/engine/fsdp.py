"""``fsdp.enabled=true`` under torchrun: the CLI's model sharded with FSDP2 over the launched ranks.

``torchrun --nproc_per_node=N -m runner ... fsdp.enabled=true hydra.run.dir=DIR`` runs one
process per rank; each joins the process group (gloo on CPU, nccl on CUDA), builds the model,
shards the modules ``fsdp.blocks`` selects on their own and then the model (FSDP2's usual
wrapping: ``fully_shard`` on each block, children before parents, then on the root) and runs the
plan as one process would. Every rank runs the step's whole batch: the parameters, gradients and
optimizer state are split over the ranks, the data is not, so each rank's records are those of the
run unsharded in one process (FSDP2 averages the ranks' equal gradients). Each rank writes
``DIR/rank-N``, rank 0 commits the run over them (``runner.store.ranks``), and ``load_stats``
gives a ``rank`` column. The run directory must be given: each rank's clock would name another.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from common.errors import ConfigError
from hooks.mechanism.select import select_modules

#: What ``torchrun`` sets for each rank, and ``init_process_group``'s ``env://`` reads.
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched() -> bool:
    """Whether this process is one rank of a ``torchrun`` launch."""
    return all(name in os.environ for name in LAUNCH_ENV)


def sharded_run(cfg) -> bool:
    """Whether the run of the composed config ``cfg`` is one rank of an FSDP2 run (its ranks share the run directory)."""
    return bool(cfg.get("fsdp", {}).get("enabled")) and launched()


def check_fsdp(settings) -> None:
    """``fsdp.enabled`` only under torchrun (outside it there is nothing to shard over; ``plan=true``
    prints the unsharded model's plan anywhere) and not with ``compile=true`` (not built)."""
    if not settings.fsdp.enabled or settings.plan:
        return
    if not launched():
        raise ConfigError("fsdp.enabled: true shards the model over the ranks torchrun launches, and this process "
                          "is not one of them (no RANK/WORLD_SIZE); run it as torchrun --nproc_per_node=2 -m runner ...")
    if settings.compile:
        raise ConfigError("fsdp.enabled: true with compile=true is not built; use one of them")


def run_dir_problem(hydra_overrides: list[str]) -> str | None:
    """Under torchrun, the one line refusing a run whose directory is not given on the command line."""
    if any(line.lstrip("+").startswith("hydra.run.dir=") for line in hydra_overrides):
        return None
    return ("fsdp.enabled: every rank writes into one run directory, and each rank's clock would name "
            "another; give it: hydra.run.dir=DIR")


def sweep_problem(cfg) -> str | None:
    """Under torchrun, the one line refusing a sweep (``-m``) of an FSDP2 run, else ``None``.

    Hydra's basic launcher runs a sweep's jobs one after another in the process that launched it:
    under torchrun every rank runs its own sweep, whose directory each rank's clock names apart,
    and a job that fails on one rank (a ``status.json``, and the sweep goes on) leaves the others
    waiting in the step's collectives. A plan (``plan=true``) shards nothing, and is let through.
    """
    if not sharded_run(cfg) or cfg.get("plan"):
        return None
    return ("fsdp.enabled: a sweep (-m) under torchrun runs every job in each rank's one process, where a job that "
            "fails on one rank leaves the others waiting; run each job as its own torchrun command without -m")


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """The ranks' process group for the block (gloo on CPU, nccl on CUDA), unless one is open already."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model: nn.Module, blocks: list[str], device: torch.device) -> nn.Module:
    """``model`` with FSDP2's ``fully_shard`` on each selected block that holds parameters (children
    before their parents), then on the model itself, over one mesh of every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    chosen = [module for _, module in select_modules(model, list(blocks), "fsdp.blocks")
              if module is not model and any(True for _ in module.parameters())]
    for module in reversed(chosen):  # named_modules order puts parents first
        fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def silent_rank() -> bool:
    """A rank of a torchrun launch other than 0: rank 0 alone prints what the run wrote."""
    return launched() and os.environ["RANK"] != "0"
