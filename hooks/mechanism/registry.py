"""The hook-type registry: YAML entries in, validated ``HookType`` objects out.

Every check that needs no model happens here, before the model is built: unknown hook types,
unknown or ill-typed keys and meaningless values each fail with one line that names the full
key, lists what is valid and suggests the closest choice.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig

from common.errors import ConfigError
from common.schema_merge import merged_object
from hooks.mechanism.base import HookType
from hooks.specs.base import HOOK_TYPES, check_finite

__all__ = ["HOOK_TYPES", "build_hook", "build_hooks", "check_finite", "register", "typed_config"]


def register(name: str) -> Callable[[type[HookType]], type[HookType]]:
    """Class decorator registering a hook type under ``name`` with its ``spec_class``: a built-in type
    declared in ``hooks.specs`` with that spec, or a user's type (stored now); a duplicate name is a bug."""

    def deco(cls: type[HookType]) -> type[HookType]:
        HOOK_TYPES.register(name, schema=cls.spec_class)(cls)
        cls.type_name = name
        return cls

    return deco


def build_hook(name: str, entry: Mapping | DictConfig) -> HookType:
    """Validate one ``hooks.NAME`` entry against its type's schema and build it."""
    key = f"hooks.{name}"
    if not isinstance(entry, (Mapping, DictConfig)):
        raise ConfigError(f"{key}: expected a mapping with at least 'type' and 'layers', got {entry!r}")
    type_name = entry.get("type")
    if type_name is None:
        raise ConfigError(f"{key}.type: missing; valid: {', '.join(sorted(HOOK_TYPES))}")
    cls = HOOK_TYPES.get(type_name, key=f"{key}.type").build
    spec = typed_config(key, cls.spec_class, entry)
    spec.check_lifetime(key)
    spec.check(key)  # first: a type's own message for a NaN says what it would do
    check_finite(key, spec)
    hook = cls(name, spec)
    hook.check_spec()
    return hook


def typed_config(key: str, spec_class: type, entry: Mapping | DictConfig, what: str = "key") -> Any:
    """``entry`` merged into the dataclass ``spec_class`` (``common.schema_merge.merged``: an unknown key
    or an ill-typed value fails in one line naming the full key), as a ``spec_class`` object."""
    return merged_object(spec_class, entry, key, what)


def build_hooks(entries: Mapping | DictConfig | None) -> list[HookType]:
    """Build every entry of the ``hooks:`` mapping, in the order the config lists them; each type
    present then checks them together (``HookType.check_with``)."""
    built = [build_hook(str(name), entry) for name, entry in (entries or {}).items()]
    for cls in dict.fromkeys(type(hook) for hook in built):
        cls.check_with(built)
    return built
