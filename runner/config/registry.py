"""The runner's registries: models, data kinds, losses, optimizers, metrics, loggers and plots, each a
``common.registry.Registry`` (as hook types are: ``hooks.specs.HOOK_TYPES``).

The built-in choices whose modules import torch, numpy or matplotlib are declared here, at the
bottom: each name, its schema (``runner.config.schema``) and the module whose ``register`` builds
it, imported when it is first used; so the command line knows them before torch is imported, and a
registration the declarations lack fails loudly (``tests/test_startup.py``). The loggers' modules
import no tool and no torch (``runner.live.to_*``): the command line imports them when it names a
logger (``runner.config.compose``).

A module the runner has never imported is named by its preset: ``_module_: mypkg.my_data``
beside the key (``data``, ``optimizer``, ``model``, ``loss``, a hook entry), imported by the gate
before the key is looked up (``import_named``).
"""
from __future__ import annotations

import importlib
from typing import Any

from common.errors import ConfigError, choice_error
from common.registry import Registry
from runner.config.schema import (AdamConfig, DatasetData, DigitsData, FakeImages, HFModel, ImageFiles,
                                  ImageFolderData, NamedModel, NoOptimizer, SGDConfig, SyntheticData, TextData,
                                  TokenData)

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
    """The one line for a ``model.name`` neither in ``models`` nor one of torchvision's (the gate's: the
    command line leaves a name it does not know to it, since torchvision's are known by importing it)."""
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


for _name in ("mlp", "convnet", "digits_cnn", "linear"):
    MODELS.declare(_name, "runner.sources.models", NamedModel)
MODELS.declare("hf", "runner.sources.models", HFModel)
for _name, _schema in {"randn": SyntheticData, "ones": SyntheticData, "fake": FakeImages, "tokens": TokenData,
                       "image": ImageFiles, "digits": DigitsData}.items():
    DATA_KINDS.declare(_name, "runner.sources.kinds", _schema)
DATA_KINDS.declare("imagefolder", "runner.sources.datasets", ImageFolderData)
DATA_KINDS.declare("dataset", "runner.sources.datasets", DatasetData)
DATA_KINDS.declare("text", "runner.sources.text", TextData)
for _name in ("sum", "mean", "one_minus_mean", "log_mean", "cross_entropy", "none", "class_score"):
    LOSSES.declare(_name, "runner.sources.losses")
for _name, _schema in {"none": NoOptimizer, "sgd": SGDConfig, "adam": AdamConfig}.items():
    OPTIMIZERS.declare(_name, "runner.sources.optimizers", _schema)
for _name in ("logit", "logit_diff"):
    METRICS.declare(_name, "runner.engine.metrics")
for _name in ("gradient_flow", "feature_maps", "grad_cam"):
    PLOTS.declare(_name, "runner.analysis.plots")
PLOTS.declare("logit_lens", "runner.analysis.lens")
PLOTS.declare("attribution_graph", "runner.analysis.graph")
