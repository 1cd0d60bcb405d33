"""``logger=wandb``: a W&B run, offline by default (``wandb sync`` uploads it later); a sweep's jobs in one group."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from runner.config.registry import LOGGERS
from runner.live.config import LoggerConfig
from runner.live.lines import LogLine
from runner.live.loggers import RunContext

#: W&B's longest group name.
MAX_GROUP = 128


class WandbMode(str, Enum):
    offline = "offline"
    online = "online"  #: needs ``wandb login`` (or ``WANDB_API_KEY``) and the network


@dataclass
class WandbLogger(LoggerConfig):
    project: str = "hook-runner"
    entity: Optional[str] = None
    mode: WandbMode = WandbMode.offline
    dir: Optional[str] = None    #: where ``wandb/`` goes; null: the run directory
    group: Optional[str] = None  #: null: a sweep's directory (its jobs side by side), none for a single run


@LOGGERS.register("wandb", schema=WandbLogger)
class WandbSink:
    """A ``wandb.Run`` whose config is the run's (and its ``overrides``); histograms as ``wandb.Histogram``."""

    library = "wandb"

    def __init__(self, cfg: WandbLogger, context: RunContext, run=None) -> None:
        import wandb

        self.histogram = wandb.Histogram
        self.owned = run is None
        if run is None:
            group = cfg.group or context.group
            run = wandb.init(project=cfg.project, entity=cfg.entity, mode=cfg.mode.value,
                             dir=str(cfg.dir or context.run_dir), name=context.name,
                             group=group[-MAX_GROUP:] if group else None,
                             config={**context.config, "overrides": list(context.overrides)}, reinit="create_new",
                             settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                                     disable_git=True, save_code=False))
        self.run = run

    def log(self, line: LogLine) -> None:
        data: dict = dict(line.scalars)
        data.update({tag: self.histogram(values) for tag, values in line.histograms.items()})
        self.run.log(data, step=line.step)

    def close(self, failed: bool) -> None:
        if self.owned:
            self.run.finish(exit_code=1 if failed else 0)
