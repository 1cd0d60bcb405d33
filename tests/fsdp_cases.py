"""The runs ``test_fsdp.py`` makes twice: under FSDP2 on two ranks (``fsdp_worker.py``, by torchrun)
and unsharded in one process (the reference, in the test). Same models, seeds, batches, entries."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import runner
from runner.sources.models import gpt2_tiny

STEPS, WORLD, LR = 2, 2, 0.1

#: The layer with a bias each model's ``zero_bias`` entry zeroes, and a middle layer for edits.
HEAD = {"mlp": "2", "gpt": "transformer.h.1.mlp.c_proj"}
MIDDLE = {"mlp": "1", "gpt": "transformer.h.0.mlp"}


def entries(case: str, kind: str, source: str = "") -> dict:
    """The hook entries of ``case`` on model ``kind`` (``source``: the stored run ``patch`` reads)."""
    return {
        "clip": {"clip": {"type": "clamp", "layers": "**", "min": -0.01, "max": 0.01}},
        "scale": {"scale": {"type": "scale", "layers": "**", "factor": 0.5}},
        "zero_bias": {"zero_bias": {"type": "replace", "layers": HEAD[kind], "params": ["bias"]}},
        "post_accumulate": {"post_accumulate": {"type": "post_accumulate", "layers": "**"}},
        "post_accumulate_sgd": {"sgd": {"type": "post_accumulate", "layers": "**", "op": "sgd", "lr": LR}},
        "clip_and_stats": {"clip": {"type": "clamp", "layers": "**", "max": 0.01},
                           "stats": {"type": "stats", "layers": "leaf:**"}},
        "ablate": {"ablate": {"type": "ablate", "layers": MIDDLE[kind]},
                   "stats": {"type": "stats", "layers": "leaf:**", "kinds": ["output"]}},
        "patch": {"patch": {"type": "patch", "layers": MIDDLE[kind], "source": source},
                  "stats": {"type": "stats", "layers": "leaf:**", "kinds": ["output"]}},
    }[case]


#: Cases whose ranks see different batches: they record parameter gradients only, which FSDP2
#: reduces over the ranks, so the reference is one process on both ranks' batches at once.
SPLIT = ("clip", "scale", "zero_bias", "post_accumulate", "post_accumulate_sgd")
#: Cases that record activations: every rank sees the whole batch, as the reference does.
WHOLE = ("clip_and_stats", "ablate", "patch")
CASES = [(kind, case) for kind in ("mlp", "gpt") for case in SPLIT + WHOLE]


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":  # a 16x3 head: its weight and bias split unevenly over two ranks
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return gpt2_tiny().eval()  # eval: no dropout, so both runs draw no random numbers


def blocks(model: torch.nn.Module, kind: str) -> list[torch.nn.Module]:
    """The modules sharded on their own before the root (FSDP2's usual wrapping)."""
    return [m for m in model if isinstance(m, torch.nn.Linear)] if kind == "mlp" else list(model.transformer.h)


def batch(kind: str, step: int, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s half of step ``step``'s batch; ``None``: the whole batch (both halves)."""
    if rank is None:
        halves = [batch(kind, step, r) for r in range(WORLD)]
        return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])
    gen = torch.Generator().manual_seed(100 * step + rank)
    if kind == "mlp":
        return torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
    tokens = torch.randint(0, 100, (2, 16), generator=gen)
    return tokens, tokens


def loss_of(model: torch.nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "mlp":
        return F.cross_entropy(model(x), y)
    return model(input_ids=x, labels=y).loss


def train(model: torch.nn.Module, kind: str, case: str, out_dir: Path, rank: int | None, source: str = "") -> None:
    """``STEPS`` SGD steps under ``case``'s entries; ``rank``: this rank's half of each batch (``SPLIT``
    cases under FSDP2), ``None``: the whole batch."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with runner.attach(model, hooks=entries(case, kind, source), out_dir=out_dir) as run:
        for step in range(STEPS):
            loss = loss_of(model, kind, *batch(kind, step, rank if case in SPLIT else None))
            run.backward(loss)
            run.step(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
