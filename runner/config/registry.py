"""Registries of what a config names by a key: models, data kinds, losses, optimizers, metrics, loggers and plots.

As torchvision's ``@register_model`` / ``get_model``: a module-level ``Registry`` filled by
``@DATA_KINDS.register("randn", schema=SyntheticData)`` where the thing is defined, so a choice
is listed in one place. Registering stores the schema in Hydra's ConfigStore
(``data_schema/randn``) for presets to inherit, and the gate merges a config into it.

A module the runner has never imported is named by its preset: ``_module_: mypkg.my_data``
beside the key (``data``, ``optimizer``, ``model``, ``loss``, a hook entry), imported by the gate
before the key is looked up (``import_named``).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

from common.errors import ConfigError, choice_error

#: The key of a config node naming the module that registers its choice.
MODULE_KEY = "_module_"


@dataclass(frozen=True)
class Entry:
    """One registered choice: what builds it and the dataclass its config is merged into."""

    name: str
    build: Any
    schema: type | None


class Registry:
    """Choices of one config key (``key``, e.g. ``data.kind``) by name; ``what`` names them in errors."""

    def __init__(self, key: str, what: str, group: str | None = None) -> None:
        self.key, self.what, self.group = key, what, group
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, schema: type | None = None) -> Callable[[Any], Any]:
        """Decorator registering ``name``; a duplicate name is a bug (``KeyError``)."""

        def deco(build: Any) -> Any:
            if name in self._entries:
                raise KeyError(f"{self.what} '{name}' is already registered by {self._entries[name].build!r}")
            self._entries[name] = Entry(name, build, schema)
            if schema is not None and self.group:
                ConfigStore.instance().store(group=self.group, name=name, node=schema)
            return build

        return deco

    def get(self, name: object) -> Entry:
        """The entry of ``name``; else the one-line error listing the choices and the closest."""
        if name not in self._entries:
            raise choice_error(self.key, name, list(self._entries), self.what)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)


MODELS = Registry("model.name", "model", "model_schema")
DATA_KINDS = Registry("data.kind", "data kind", "data_schema")
LOSSES = Registry("loss.name", "loss")
OPTIMIZERS = Registry("optimizer.name", "optimizer", "optimizer_schema")
#: Per-step measures of the model's output (``runner.engine.metrics``), each a ``steps.parquet`` column.
METRICS = Registry("metric.measures", "per-step measure")
#: Live loggers (``logger=tensorboard``): filled by ``runner.live``'s ``to_*`` modules, which import their tool lazily.
LOGGERS = Registry("logger", "logger", "logger_schema")
#: Filled by ``runner.analysis.plots`` (imported by the gate only when pictures are asked for: matplotlib).
PLOTS = Registry("plots", "plot")


def import_named(node: Any, key: str) -> None:
    """Import the module ``node._module_`` names (a no-op without one), so its choices are registered."""
    name = node.get(MODULE_KEY) if hasattr(node, "get") else None
    if not name:
        return
    try:
        importlib.import_module(str(name))
    except Exception as exc:  # noqa: BLE001 - missing, or the user's module raised while importing
        raise ConfigError(f"{key}.{MODULE_KEY}: cannot import '{name}': {type(exc).__name__}: {exc}") from None
