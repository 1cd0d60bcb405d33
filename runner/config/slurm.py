"""The schema of ``hydra/launcher=slurm``: upstream's Slurm settings plus the runner's wait for an
unschedulable sweep, stored in Hydra's ConfigStore as ``hydra/launcher/runner_slurm``.

Apart from the launcher (``hydra_plugins.runner_slurm``, which imports the callbacks, which import the
command line) so that composing a config (``runner.config.compose``) stores the presets' schema.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from omegaconf import MISSING


#: Pending reasons that do not resolve by waiting: the request fits no node or limit of the partition.
#: (``Resources`` and ``Priority`` mean a busy cluster; add them to ``unschedulable_reasons`` to stop on them too.)
UNSCHEDULABLE = ("PartitionConfig", "ReqNodeNotAvail", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                 "InvalidAccount", "InvalidQOS", "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob", "QOSMaxGRESPerJob")


@dataclass
class RunnerSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.runner_slurm.launcher.SlurmLauncher"
    #: Required (a ``???`` in a preset does not replace upstream's ``None`` when merged).
    partition: Optional[str] = MISSING
    #: Seconds every job of the sweep may stay PENDING for one of ``unschedulable_reasons`` before the
    #: sweep is cancelled with the reason; null: wait forever.
    unschedulable_after_s: Optional[float] = 120.0
    unschedulable_reasons: List[str] = field(default_factory=lambda: list(UNSCHEDULABLE))


ConfigStore.instance().store(group="hydra/launcher", name="runner_slurm", node=RunnerSlurmConf, provider="runner")
