"""What a live logger logs (``LoggerConfig``), and the check of ``logger.*`` against the registry.

Every logger takes these keys; a tool's own keys (``logger.wandb.project``) are in its schema,
registered with it in ``runner.config.registry.LOGGERS`` (``runner.live.to_tensorboard`` and the others).
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Optional


from common.errors import ConfigError, choice_error
from common.records import STAT_COLUMNS
from common.schema_merge import merged_object
from hooks.specs import HOOK_TYPES
from runner.config.registry import LOGGERS

#: The extra that installs every logger's library.
LOGGER_EXTRA = "pip install 'hook-runner[loggers]'"
#: Modules registering the loggers (each imports its tool only when a run opens it).
BACKENDS = ("runner.live.to_tensorboard", "runner.live.to_wandb", "runner.live.to_mlflow")


@dataclass
class StatsByKind:
    """The statistics logged of each kind of capture (``common.records.KINDS``); by default activation
    std and per-layer gradient L2 (of module outputs and of parameters); ``[]``: none of that kind."""

    input: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=lambda: ["std"])
    grad_input: list[str] = field(default_factory=list)
    grad_output: list[str] = field(default_factory=lambda: ["l2"])
    param_grad: list[str] = field(default_factory=lambda: ["l2"])
    saved: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    """``every``: log every k-th step (from step 0); ``entries``: the hook entries whose statistics are
    logged (null: every entry of type ``stats``); ``stats``: per kind, the statistics logged
    (``StatsByKind``); ``histograms``: every kept tensor as a histogram
    (where the tool has them); ``queue``: steps waiting to be sent, beyond which the oldest waiting
    is skipped; ``close_timeout_s``: at the run's end, how long a logger that sends nothing more is
    waited for (a tool slow to open: ``wandb.init`` takes a minute on a loaded machine), unless its
    process ended or its server is unreachable."""

    every: int = 1  #: log every k-th step, from step 0
    entries: Optional[list[str]] = None  #: the hook entries whose statistics are logged (null: every ``stats`` entry)
    stats: StatsByKind = field(default_factory=StatsByKind)  #: per kind, the statistics logged (``[]``: none of that kind)
    histograms: bool = True  #: every kept tensor as a histogram, where the tool has them
    queue: int = 256  #: steps waiting to be sent, beyond which the oldest waiting is skipped
    close_timeout_s: float = 60.0  #: at the run's end, how long a logger that sends nothing more is waited for

    def server(self) -> str | None:
        """The URL of the server the tool sends to (``http://HOST:PORT``), whose reachability names a
        failure and ends a hung tool at the run's end; None: a tool without one (files, an offline run)."""
        return None


def register_backends() -> None:
    """Import the modules that register the loggers (they import no tool's library)."""
    for name in BACKENDS:
        importlib.import_module(name)


def typed_loggers(chosen: Any, entry_types: dict[str, str] | None = None) -> dict[str, LoggerConfig]:
    """``logger.*`` as checked dataclasses by logger name: a name, key, kind or statistic that does not
    exist, or a tool that is not installed, is one ``ConfigError`` line.

    ``entry_types``: the run's hook entries and their types, to check ``entries`` against.
    """
    register_backends()
    typed = {}
    for name, node in dict(chosen or {}).items():
        entry = LOGGERS.get(name)
        cfg = merged_object(entry.schema, node, f"logger.{name}", f"key of logger '{name}'")
        _check(name, cfg, entry_types)
        if importlib.util.find_spec(entry.build.library) is None:
            raise ConfigError(f"logger={name}: the '{entry.build.library}' package is not installed; {LOGGER_EXTRA}")
        typed[name] = cfg
    return typed


def _check(name: str, cfg: LoggerConfig, entry_types: dict[str, str] | None) -> None:
    for key, value in (("every", cfg.every), ("queue", cfg.queue)):
        if value < 1:
            raise ConfigError(f"logger.{name}.{key}: {value} must be at least 1")
    if not cfg.close_timeout_s > 0:
        raise ConfigError(f"logger.{name}.close_timeout_s: {cfg.close_timeout_s!r} must be a positive number of seconds")
    for kind, stats in vars(cfg.stats).items():
        for stat in stats:
            if stat not in STAT_COLUMNS:
                raise choice_error(f"logger.{name}.stats.{kind}", stat, STAT_COLUMNS, "statistic")
    if entry_types is not None:
        for key in cfg.entries or ():
            if key not in entry_types:
                raise choice_error(f"logger.{name}.entries", key, list(entry_types) or ["(no hook entries)"], "hook entry")


def stats_by_kind(cfg: LoggerConfig) -> dict[str, list[str]]:
    """The kinds ``cfg`` logs statistics of, with those statistics."""
    return {kind: stats for kind, stats in vars(cfg.stats).items() if stats}


def logged_entries(cfg: LoggerConfig, entry_types: dict[str, str]) -> frozenset[str]:
    """The entries whose statistics ``cfg`` logs: those it names, else every entry whose type's spec says its
    rows are logged live (``HookSpec.logged_live``: ``stats``)."""
    if cfg.entries is not None:
        return frozenset(cfg.entries)
    specs = {key: HOOK_TYPES.schema_of(kind) for key, kind in entry_types.items()}
    return frozenset(key for key, spec in specs.items() if spec is not None and spec.logged_live)
