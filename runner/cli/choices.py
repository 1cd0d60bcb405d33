"""Every choice a composed config names, looked up in the registries before torch is imported.

A hook type, model, data kind, loss, optimizer, logger, plot or per-step measure that is not
registered fails here with the line the gate's own lookup gives: the registries are the gate's,
holding every built-in choice as declared (``hooks.specs``, ``runner.config.registry``), and
``Registry.check`` imports nothing. A node naming a user's module (``_module_``) is left to the gate,
which imports it first: that module may register the name. So is a ``model.name`` that is no
registered model: torchvision's names are known by importing torchvision, which the gate does.
Nothing here replaces a gate check; it answers a typo without importing torch.
"""
from __future__ import annotations

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from hooks.specs import HOOK_TYPES
from runner.config.registry import DATA_KINDS, LOGGERS, LOSSES, METRICS, MODULE_KEY, OPTIMIZERS, PLOTS

#: The groups naming one choice of a registry: (config key, registry, the key holding the name).
_NAMED = (("data", DATA_KINDS, "kind"), ("loss", LOSSES, "name"), ("optimizer", OPTIMIZERS, "name"))


def check_choices(cfg: DictConfig) -> None:
    """Raise the gate's ``ConfigError`` for the first choice of ``cfg`` that is not registered."""
    try:
        _check(cfg)
    except OmegaConfBaseException:
        return  # a missing or unresolvable value: the gate names it


def _check(cfg: DictConfig) -> None:
    for name, entry in (cfg.get("hooks") or {}).items():
        if _own(entry) and entry.get("type") is not None:
            HOOK_TYPES.check(entry.type, key=f"hooks.{name}.type")
    for group, registry, key in _NAMED:
        node = cfg.get(group)
        if _own(node):
            registry.check(node.get(key))
    for name in cfg.get("logger") or {}:
        LOGGERS.check(name)
    for index, name in enumerate(cfg.get("plots") or ()):
        PLOTS.check(name, key=f"plots[{index}]")
    metric = cfg.get("metric")
    if _own(metric) and metric.get("measures") is not None:
        for name in metric.measures:
            METRICS.check(name)


def _own(node: object) -> bool:
    """A mapping whose choices are the built-in ones (no ``_module_`` that may register more)."""
    return isinstance(node, DictConfig) and not node.get(MODULE_KEY)
