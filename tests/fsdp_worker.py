"""Run by ``test_fsdp.py`` under ``torchrun --nproc_per_node=2``: every case of ``fsdp_cases`` on
models sharded with FSDP2 (gloo, CPU), then every hook preset once, each run or refused.

Usage: fsdp_worker.py OUT SOURCE_MLP SOURCE_GPT. Writes OUT/KIND-CASE (the runs),
OUT/KIND-CASE.pt (the trained weights, whole, from rank 0) and OUT/presets-RANK.json
(``{preset: "ok" | "refused: <line>"}``; anything else raised ends the rank, failing the test).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fsdp_cases
from common.errors import ConfigError
import runner

ROOT = Path(__file__).resolve().parents[1]


def sharded(kind: str, mesh) -> torch.nn.Module:
    model = fsdp_cases.build(kind)
    for block in fsdp_cases.blocks(model, kind):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def every_preset(out: Path, mesh, source: str) -> dict[str, str]:
    """Each preset of ``conf/hooks`` on the sharded MLP for one step (layers "**"; patch's the stored ones)."""
    outcomes = {}
    for preset in sorted(p.stem for p in (ROOT / "conf" / "hooks").glob("*.yaml")):
        model = sharded("mlp", mesh)
        if preset == "none":
            overrides = []
        elif preset == "patch":
            overrides = [f"hooks.patch.layers='{fsdp_cases.MIDDLE['mlp']}'", f"hooks.patch.source={source}"]
        else:
            overrides = [f"hooks.{preset}.layers=**"]
        try:
            with runner.attach(model, hooks=[preset], overrides=overrides, out_dir=out / f"preset-{preset}") as run:
                loss = fsdp_cases.loss_of(model, "mlp", *fsdp_cases.batch("mlp", 0, None))
                run.backward(loss)
                run.step(loss)
            outcomes[preset] = "ok"
        except ConfigError as exc:  # anything else ends the rank, and the test names it
            outcomes[preset] = f"refused: {exc}"
    return outcomes


def main(out: Path, sources: dict[str, str]) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (fsdp_cases.WORLD,))
    for kind, case in fsdp_cases.CASES:
        model = sharded(kind, mesh)
        fsdp_cases.train(model, kind, case, out / f"{kind}-{case}", rank, sources[kind])
        weights = {name: p.full_tensor() for name, p in model.named_parameters()}
        if rank == 0:
            torch.save(weights, out / f"{kind}-{case}.pt")
    outcomes = every_preset(out, mesh, sources["mlp"])
    (out / f"presets-{rank}.json").write_text(json.dumps(outcomes, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), {"mlp": sys.argv[2], "gpt": sys.argv[3]})
