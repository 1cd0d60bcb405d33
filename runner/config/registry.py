"""The runner's registries: models, data kinds, losses, optimizers, metrics, loggers and plots, each a
``common.registry.Registry`` (as hook types are: ``hooks.registry.HOOK_TYPES``).

A module the runner has never imported is named by its preset: ``_module_: mypkg.my_data``
beside the key (``data``, ``optimizer``, ``model``, ``loss``, a hook entry), imported by the gate
before the key is looked up (``import_named``).
"""
from __future__ import annotations

import importlib
from typing import Any

from common.errors import ConfigError, choice_error
from common.registry import Registry

#: The key of a config node naming the module that registers its choice.
MODULE_KEY = "_module_"

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


def check_model_name(name: object, models: Registry, torchvision_names: list[str]) -> None:
    """The one line for a ``model.name`` neither in ``models`` nor one of torchvision's: the gate's and the
    command line's (``runner.cli.choices``, with the static index's names before torchvision is imported)."""
    if name not in models and name not in torchvision_names:
        raise choice_error("model.name", name, [*models, *torchvision_names], "model")


def import_named(node: Any, key: str) -> None:
    """Import the module ``node._module_`` names (a no-op without one), so its choices are registered."""
    name = node.get(MODULE_KEY) if hasattr(node, "get") else None
    if not name:
        return
    try:
        importlib.import_module(str(name))
    except Exception as exc:  # noqa: BLE001 - missing, or the user's module raised while importing
        raise ConfigError(f"{key}.{MODULE_KEY}: cannot import '{name}': {type(exc).__name__}: {exc}") from None
