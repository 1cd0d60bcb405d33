"""The Lightning fit ``test_integrations_lightning_fsdp.py`` makes twice: with Lightning's FSDP2
strategy (``ModelParallelStrategy``: ``fully_shard`` in ``configure_model``) on two CPU ranks under
torchrun, and unsharded on one process. Same module, seed, batches, entries.

Run as a script under torchrun (``lightning_fsdp_cases.py OUT``) it makes the sharded fit into OUT.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning
from runner.integrations.lightning import HookCallback

HOOKS, OVERRIDES = ["clip", "stats"], ["hooks.clip.max=0.01"]


class Classifier(lightning.LightningModule):
    """Two linear layers; ``shard``: each, then the pair, sharded with FSDP2 over the strategy's mesh."""

    def __init__(self, shard: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.shard = shard

    def configure_model(self) -> None:
        if not self.shard:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def fit(out_dir, sharded: bool) -> None:
    """3 steps of batch 6; every rank sees every batch (no distributed sampler), so each rank's
    records are those of the unsharded fit (FSDP2 averages the ranks' equal gradients)."""
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(18, 8, generator=g), torch.randint(0, 3, (18,), generator=g)),
                      batch_size=6)
    strategy = lightning.pytorch.strategies.ModelParallelStrategy() if sharded else "auto"
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=2 if sharded else 1, strategy=strategy,
                                use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                callbacks=[HookCallback(hooks=HOOKS, overrides=OVERRIDES, out_dir=out_dir)])
    trainer.fit(Classifier(sharded), data)


if __name__ == "__main__":
    fit(sys.argv[1], sharded=True)
