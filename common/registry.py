"""One registry class for every choice a config names by a key: hook types (``hooks.mechanism.registry``),
models, data kinds, losses, optimizers, per-step measures, loggers and plots (``runner.config.registry``).

As torchvision's ``@register_model`` / ``get_model``: a module-level ``Registry`` filled by
``@DATA_KINDS.register("randn", schema=SyntheticData)`` where the thing is defined, so a choice is
listed in one place. Registering stores the schema in Hydra's ConfigStore (``data_schema/randn``)
for presets to inherit, whenever the module is imported (a user's module imported late included);
``get`` gives the one-line error for an unknown name.

A built-in choice whose module imports torch is *declared* first, as SPEC 1's lazy loading does
(``lazy_loader``): its name, its schema and the module that registers it, from a module importing
no torch (``hooks.specs``, ``runner.config.registry``), so the command line is checked before torch is
imported; ``get`` imports the module when what builds the choice is first asked for, and that
module's own ``register`` completes the declaration (with the same schema, else ``KeyError``).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from common.errors import choice_error


@dataclass(frozen=True)
class Entry:
    """One registered choice: what builds it and the dataclass its config is merged into; ``module``,
    for a declared choice, the module registering what builds it (``build`` is ``None`` until then)."""

    name: str
    build: Any
    schema: type | None
    module: str | None = None
    registered: bool = True


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
            declared = self._entries.get(name)
            if declared is not None and declared.registered:
                raise KeyError(f"{self.what} '{name}' is already registered by {declared.build!r}")
            if declared is not None:  # the declaration's module registering it: the same schema
                if schema is not declared.schema:
                    raise KeyError(f"{self.what} '{name}' is declared with schema {declared.schema!r}, "
                                   f"registered with {schema!r}")
                self._entries[name] = replace(declared, build=build, registered=True)
                return build
            self._entries[name] = Entry(name, build, schema)
            if schema is not None and self.group:
                self.store(name, schema)
            return build

        return deco

    def declare(self, name: str, module: str, schema: type | None = None) -> None:
        """Register ``name`` and its ``schema`` now, and what builds it when ``module`` is imported (by
        ``get``, at the first use); a duplicate name is a bug (``KeyError``)."""
        if name in self._entries:
            raise KeyError(f"{self.what} '{name}' is already registered by {self._entries[name].build!r}")
        self._entries[name] = Entry(name, None, schema, module, registered=False)
        if schema is not None and self.group:
            self.store(name, schema)

    def declared(self) -> dict[str, str]:
        """The declared choices' names and the modules registering them."""
        return {name: entry.module for name, entry in self._entries.items() if entry.module is not None}

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
        self.check(name, key)
        entry = self._entries[name]
        if not entry.registered:
            importlib.import_module(entry.module)
            entry = self._entries[name]
            if not entry.registered:
                raise KeyError(f"{self.what} '{name}' is declared in {entry.module}, which does not register it")
        return entry

    def check(self, name: object, key: str | None = None) -> None:
        """``get``'s one-line error for a ``name`` not registered, importing nothing."""
        if name not in self._entries:
            raise choice_error(key or self.key, name, list(self._entries), self.what)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
