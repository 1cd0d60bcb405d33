"""``LiveLoggers``: the chosen loggers of one run, fed from the background writer's thread.

``open_run`` makes it before the run's outputs and starts it once the run directory is claimed
(nothing of a refused run reaches a tool); ``offer`` is called on the writer thread after each
step's parquet rows, ``say_problems`` on the run's thread after each step (a logger's first
failure, once), and leaving the block closes every channel after the run's files were committed
(the last lines sent within ``close_timeout_s``) and says, once per logger, how many lines did
not reach its tool and why.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner.live.channel import Channel, Sink
from runner.live.config import LoggerConfig, logged_entries, stats_by_kind
from runner.live.lines import add_histograms, add_statistics, step_scalars
from runner.live.process import ProcessSink

if TYPE_CHECKING:  # the tool's process (``process``) imports this module: no torch for it
    from hooks.mechanism.recorder import StepCaptures


class LoggerWarning(UserWarning):
    """A live logger dropped log lines (slow, unreachable, or not started): the run went on."""


@dataclass(frozen=True)
class RunContext:
    """What a tool's run is made with: the run directory, the resolved config (a dict) and the
    overrides (the tool's config/params), and a sweep's directory (``group``: its jobs are grouped)."""

    run_dir: Path
    config: dict = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    group: str | None = None

    @property
    def name(self) -> str:
        """The run's name in the tool: a sweep job's number, else the run directory's name."""
        return self.run_dir.name


class LiveLoggers:
    """The loggers ``configs`` names (``typed_loggers``); ``sinks``: some of them already open (a
    trainer's own logger of that tool, which the run then logs through instead of opening its own)."""

    def __init__(self, configs: Mapping[str, LoggerConfig], context: RunContext, entry_types: dict[str, str],
                 sinks: Mapping[str, Sink] | None = None) -> None:
        self.configs = dict(configs)
        self.context = context
        self._sinks = {name: sink for name, sink in (sinks or {}).items() if name in self.configs}
        self.entries = {name: logged_entries(cfg, entry_types) for name, cfg in self.configs.items()}
        self.stats = {name: stats_by_kind(cfg) for name, cfg in self.configs.items()}
        self.channels: dict[str, Channel] = {}

    def __bool__(self) -> bool:
        return bool(self.configs)

    def start(self) -> None:
        """Start one channel per logger: each opens its tool in a process of its own (``ProcessSink``),
        or sends to the open sink it was given (a trainer's own logger lives in the run's process)."""
        for name, cfg in self.configs.items():
            if name in self._sinks:
                opener = (lambda sink=self._sinks[name]: sink)
            else:  # started on the channel's thread (its process is killed when that thread ends), opened there
                opener = (lambda name=name, cfg=cfg: ProcessSink(name, cfg, self.context))
            self.channels[name] = Channel(name, opener, cfg.queue, cfg.close_timeout_s)

    def offer(self, step: int, split: str, captures: StepCaptures, loss: float | None,
              metrics: dict[str, float | None]) -> None:
        """On the writer thread: each logger's line of one written step (those its ``every`` skips: none)."""
        for name, channel in self.channels.items():
            cfg = self.configs[name]
            if step % cfg.every:
                continue
            line = step_scalars(step, split, loss, metrics)
            add_statistics(line, captures, self.entries[name], self.stats[name])
            if cfg.histograms:
                add_histograms(line, captures)
            channel.put(line)

    def wait_sent(self, timeout_s: float | None = None) -> bool:
        """Wait until each logger sent (or dropped) every line offered so far; False if ``timeout_s`` passed first."""
        return all(channel.wait_sent(timeout_s) for channel in self.channels.values())

    def say_problems(self) -> None:
        """On the run's thread: one ``LoggerWarning`` for each logger's first failure (falling behind is
        said at the end, with its count)."""
        for name, channel in self.channels.items():
            problem = channel.take_problem()
            if problem:
                warnings.warn(f"logger {name}: {problem}; the lines it cannot send are dropped and the run goes on "
                              f"(the parquet files are its record)", LoggerWarning, stacklevel=3)

    def __enter__(self) -> LiveLoggers:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close every channel, then one ``LoggerWarning`` for each logger that did not send every line
        (how many, and why: its first failure, else that it fell behind) or failed since last said."""
        for channel in self.channels.values():
            channel.close(failed=exc_type is not None)
        for name, channel in self.channels.items():
            summary = channel.summary()
            if summary:
                warnings.warn(f"logger {name}: {summary}; the parquet files are the run's record", LoggerWarning,
                              stacklevel=2)
