"""``logger=tensorboard``: event files under the run directory (``RUN/tensorboard``, where the export writes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from common.records import EVENTS_DIR
from runner.config.registry import LOGGERS
from runner.live.config import LoggerConfig
from runner.live.lines import LogLine
from runner.live.loggers import RunContext


@dataclass
class TensorBoardLogger(LoggerConfig):
    dir: Optional[str] = None  #: where the event files go; null: the run directory's ``tensorboard/``


@LOGGERS.register("tensorboard", schema=TensorBoardLogger)
class TensorBoardSink:
    """A ``SummaryWriter``; the run's config and overrides as text (``config``, ``overrides``)."""

    library = "tensorboard"

    def __init__(self, cfg: TensorBoardLogger, context: RunContext, writer=None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.summary import histogram

        self.summary, self.histogram = Summary, histogram  # imported once, not on every step's line
        self.owned = writer is None
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(Path(cfg.dir) if cfg.dir else context.run_dir / EVENTS_DIR))
            writer.add_text("config", f"```\n{yaml.safe_dump(context.config, sort_keys=False)}```")
            writer.add_text("overrides", " ".join(context.overrides) or "(none)")
        self.writer = writer

    @classmethod
    def adopt(cls, writer) -> TensorBoardSink:
        """A sink writing through an open ``SummaryWriter`` (a trainer's own logger's; left open at the end)."""
        return cls(TensorBoardLogger(), RunContext(Path(".")), writer)

    @classmethod
    def into(cls, log_dir: str | Path) -> TensorBoardSink:
        """A sink with a ``SummaryWriter`` of its own in another writer's directory (a trainer's, whose
        writer is out of reach): TensorBoard shows a directory's event files as one run. Closed at the end."""
        from torch.utils.tensorboard import SummaryWriter

        sink = cls.adopt(SummaryWriter(log_dir=str(log_dir)))
        sink.owned = True
        return sink

    def log(self, line: LogLine) -> None:
        """The line as one event: one ``Summary`` of all its scalars and histograms. ``add_scalar`` makes an
        event per value, each a hand-over to the event file's thread: on 2 cores each wake-up of that
        thread stalls torch's compute threads (``benchmarks.loggers`` counts them)."""
        if self.writer.file_writer is None:
            raise RuntimeError("its SummaryWriter was closed")
        values = [self.summary.Value(tag=tag, simple_value=value) for tag, value in line.scalars.items()]
        for tag, array in line.histograms.items():
            values.extend(self.histogram(tag, array, self.writer.default_bins).value)
        self.writer.file_writer.add_summary(self.summary(value=values), line.step)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        if self.owned:
            self.writer.close()
        else:
            self.writer.flush()
