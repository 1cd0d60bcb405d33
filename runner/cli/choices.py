"""Every choice a composed config names, looked up in the static index before torch is imported.

A hook type, model, data kind, loss, optimizer, logger, plot or per-step measure that is not
registered fails here with the line the gate's own lookup gives (the index's stand-in registries,
``runner.config.index``, hold the same key, names and wording). A node naming a user's module
(``_module_``) is left to the gate, which imports it first: that module may register the name.
Nothing here replaces a gate check; it answers a typo without importing torch.
"""
from __future__ import annotations

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from common.registry import Registry
from runner.config.index import stand_ins, torchvision_models
from runner.config.registry import MODULE_KEY, check_model_name

#: The groups naming one choice of a registry: (config key, registry label, the key holding the name).
_NAMED = (("data", "data_kinds", "kind"), ("loss", "losses", "name"), ("optimizer", "optimizers", "name"))


def check_choices(cfg: DictConfig) -> None:
    """Raise the gate's ``ConfigError`` for the first choice of ``cfg`` that is not registered."""
    try:
        _check(cfg, stand_ins())
    except OmegaConfBaseException:
        return  # a missing or unresolvable value: the gate names it


def _check(cfg: DictConfig, registries: dict[str, Registry]) -> None:
    for name, entry in (cfg.get("hooks") or {}).items():
        if _own(entry) and entry.get("type") is not None:
            registries["hook_types"].get(entry.type, key=f"hooks.{name}.type")
    model = cfg.get("model")
    known = torchvision_models()  # None: another torchvision than the indexed, whose names the gate reads
    if _own(model) and "_target_" not in model and known is not None:
        check_model_name(model.get("name"), registries["models"], known)
    for group, label, key in _NAMED:
        node = cfg.get(group)
        if _own(node):
            registries[label].get(node.get(key))
    for name in cfg.get("logger") or {}:
        registries["loggers"].get(name)
    for index, name in enumerate(cfg.get("plots") or ()):
        registries["plots"].get(name, key=f"plots[{index}]")
    metric = cfg.get("metric")
    if _own(metric) and metric.get("measures") is not None:
        for name in metric.measures:
            registries["metrics"].get(name)


def _own(node: object) -> bool:
    """A mapping whose choices are the built-in ones (no ``_module_`` that may register more)."""
    return isinstance(node, DictConfig) and not node.get(MODULE_KEY)
