"""``logger=wandb``: a W&B run, offline by default (``wandb sync`` uploads it later); a sweep's jobs in one group."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Optional

from runner.config.registry import LOGGERS
from runner.live.config import LoggerConfig
from runner.live.lines import LogLine
from runner.live.loggers import RunContext

#: W&B's longest group name.
MAX_GROUP = 128
#: The key of the run's step in a trainer's own W&B run (whose own step counts its ``log`` calls).
STEP_KEY = "hook_runner/step"


class WandbMode(str, Enum):
    offline = "offline"
    online = "online"  #: needs ``wandb login`` (or ``WANDB_API_KEY``) and the network


@dataclass
class WandbLogger(LoggerConfig):
    project: str = "hook-runner"  #: the W&B project
    entity: Optional[str] = None  #: the W&B user or team (null: your default)
    mode: WandbMode = WandbMode.offline  #: ``offline`` (files only, the default) or ``online``
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

    @classmethod
    def adopt(cls, run) -> WandbSink:
        """A sink logging into an open ``wandb.Run`` (a trainer's own; not finished at the end). Its step
        counter is the trainer's: the run's step goes in key ``STEP_KEY`` instead."""
        return cls(WandbLogger(), RunContext(Path(".")), run)

    def log(self, line: LogLine) -> None:
        data: dict = dict(line.scalars)
        data.update({tag: self.histogram(values) for tag, values in line.histograms.items()})
        if self.owned:
            self.run.log(data, step=line.step)
        else:
            self.run.log({**data, STEP_KEY: line.step})

    def close(self, failed: bool) -> None:
        if self.owned:
            self.run.finish(exit_code=1 if failed else 0)
