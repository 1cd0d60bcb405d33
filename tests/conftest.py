"""Shared fixtures: configs composed with Hydra's compose API, runs into tmp_path, leak checks."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

import runner.analysis as analysis
from runner.run import run

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def make_config(*overrides: str):
    """The config ``python -m runner OVERRIDES`` would see."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def run_with(tmp_path):
    """Run the runner in-process with ``overrides``; return the run directory."""
    counter = iter(range(1000))

    def _run(*overrides: str) -> Path:
        out = tmp_path / f"run{next(counter)}"
        return run(make_config(*overrides), out, overrides)

    return _run


def stats_of(run_dir: Path, **where):
    """``stats.parquet`` rows whose columns equal ``where``."""
    df = analysis.load_stats(run_dir)
    for key, value in where.items():
        df = df[df[key] == value]
    return df.reset_index(drop=True)


def hook_count(model: nn.Module) -> int:
    """Every hook PyTorch keeps for ``model``: per module, per parameter and global (including an
    open ``saved_tensors_hooks`` context)."""
    from torch.nn.modules import module as M

    total = int(torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            total += len(getattr(m, attr, {}) or {})
    for p in model.parameters():
        total += len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks"):
        total += len(getattr(M, name))
    return total


def seeded_batch(shape, seed: int = 0) -> torch.Tensor:
    """The first ``randn`` batch the runner draws for ``seed``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
