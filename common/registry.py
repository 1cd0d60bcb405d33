"""One registry class for every choice a config names by a key: hook types (``hooks.registry``),
models, data kinds, losses, optimizers, per-step measures, loggers and plots (``runner.config.registry``).

As torchvision's ``@register_model`` / ``get_model``: a module-level ``Registry`` filled by
``@DATA_KINDS.register("randn", schema=SyntheticData)`` where the thing is defined, so a choice is
listed in one place. Registering stores the schema in Hydra's ConfigStore (``data_schema/randn``)
for presets to inherit, whenever the module is imported (a user's module imported late included);
``get`` gives the one-line error for an unknown name.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from common.errors import choice_error


@dataclass(frozen=True)
class Entry:
    """One registered choice: what builds it and the dataclass its config is merged into."""

    name: str
    build: Any
    schema: type | None


class Registry:
    """Choices of one config key (``key``, e.g. ``data.kind``) by name; ``what`` names them in errors.

    With a ``group``, a choice registered with a schema is stored in Hydra's ConfigStore as
    ``GROUP/NAME``; with a ``name_field`` too, the stored node has that field set to the name (a hook
    preset inherits ``hook_schema/clamp`` with ``type: clamp`` filled in).
    """

    def __init__(self, key: str, what: str, group: str | None = None, name_field: str | None = None) -> None:
        self.key, self.what, self.group, self.name_field = key, what, group, name_field
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, schema: type | None = None) -> Callable[[Any], Any]:
        """Decorator registering ``name``; a duplicate name is a bug (``KeyError``)."""

        def deco(build: Any) -> Any:
            if name in self._entries:
                raise KeyError(f"{self.what} '{name}' is already registered by {self._entries[name].build!r}")
            self._entries[name] = Entry(name, build, schema)
            if schema is not None and self.group:
                self.store(name, schema)
            return build

        return deco

    def store(self, name: str, schema: type) -> None:
        """Store ``schema`` in Hydra's ConfigStore as ``GROUP/NAME`` (what presets of ``name`` inherit)."""
        ConfigStore.instance().store(group=self.group, name=name, node=self._node(name, schema))

    def stored(self, name: str) -> bool:
        """Whether ConfigStore holds a schema for ``name`` in this registry's group."""
        try:
            return f"{name}.yaml" in ConfigStore.instance().list(self.group)
        except OSError:  # Hydra's "Path not found": nothing stored in the group yet
            return False

    def _node(self, name: str, schema: type) -> Any:
        """What ConfigStore stores for ``name``: the schema, with ``name_field`` filled in when there is one."""
        if self.name_field is None:
            return schema
        node = OmegaConf.structured(schema)
        node[self.name_field] = name
        return node

    def get(self, name: object, key: str | None = None) -> Entry:
        """The entry of ``name``; else the one-line error listing the choices and the closest, naming
        ``key`` (default: the registry's own; a hook type's key is its entry's, ``hooks.NAME.type``)."""
        if name not in self._entries:
            raise choice_error(key or self.key, name, list(self._entries), self.what)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
