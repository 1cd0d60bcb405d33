"""``hydra/sweeper=runner`` (the default in ``conf/config.yaml``): Hydra's basic sweeper, less its second
composition of every job.

Before it launches a batch, Hydra's basic sweeper composes every job's config again to catch
composition errors (``validate_batch_is_legal``; Hydra's own comment: "This can be a bit slow for
large jobs"). ``python -m runner`` has composed, compiled and rehearsed every job already, before
Hydra started (``runner.cli.commandline``), and a sweep it refused never reaches Hydra: composing
them all again was half of the CPU time before the first step of a 64-job patching sweep. This
sweeper is the basic one in all else: the same jobs in the same order, batches and launchers.
"""
# No ``from __future__ import annotations``: Hydra loads plugin modules outside ``sys.modules``, where a
# dataclass cannot read string annotations.
from collections.abc import Sequence
from dataclasses import dataclass

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf  # Hydra has no public one
from hydra.core.config_store import ConfigStore


@dataclass
class CheckedSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.runner_sweeper.sweeper.CheckedSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="runner", node=CheckedSweeperConf, provider="runner")


class CheckedSweeper(BasicSweeper):
    """Hydra's basic sweeper, which trusts the command line's check of every job."""

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Nothing to do: every job of the batch was composed and checked before Hydra started."""
