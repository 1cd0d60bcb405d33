"""The static index of registered names: every registry's choices and schemas, readable without torch.

The command line is checked before torch, torchvision or a hook module is imported
(``runner.cli.names``): Hydra composes the job against the schemas this index rebuilds (a hook
preset inherits ``hook_schema/clamp``, whose dataclass lives in a module that imports torch), and
each choice is looked up in a stand-in ``Registry`` holding the registered names, so a typo costs
what importing Hydra costs. ``runner/config/registered.py`` holds the index; it is generated from
the live registries by ``python -m runner.config.index`` and ``tests/test_startup.py`` checks it
equals them, so it cannot drift from the code.

A schema is kept as its base schema and the fields it adds or changes: name, type
(``Optional[list[int]]``, an enum or a nested dataclass by name) and default; ``schemas()`` rebuilds each as a dataclass of the same name and shape, which
OmegaConf types and checks as it checks the original. Stand-ins never replace a schema the real
module already stored (``stand_ins``).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import importlib.metadata
import pprint
import sys
import types
import typing
from pathlib import Path
from typing import Any, Optional

from common.registry import Registry

#: Where each registry lives: the module holding it and its attribute (``hooks.registry.HOOK_TYPES``).
REGISTRIES = {
    "hook_types": ("hooks.registry", "HOOK_TYPES"),
    "models": ("runner.config.registry", "MODELS"),
    "data_kinds": ("runner.config.registry", "DATA_KINDS"),
    "losses": ("runner.config.registry", "LOSSES"),
    "optimizers": ("runner.config.registry", "OPTIMIZERS"),
    "metrics": ("runner.config.registry", "METRICS"),
    "loggers": ("runner.config.registry", "LOGGERS"),
    "plots": ("runner.config.registry", "PLOTS"),
}
#: The modules whose import registers every built-in choice (``plots`` and ``lens``: only with pictures).
REGISTERING = ("hooks", "runner.sources", "runner.live", "runner.engine.metrics", "runner.analysis.plots",
               "runner.analysis.lens")
INDEX_FILE = Path(__file__).with_name("registered.py")
_TYPE_NAMES = {"Any": Any, "Optional": Optional, "str": str, "int": int, "float": float, "bool": bool,
               "list": list, "dict": dict}


def live_index() -> dict[str, Any]:
    """The index as the registries hold it once every registering module is imported (imports torch)."""
    for module in REGISTERING:
        importlib.import_module(module)
    import torchvision

    described: dict[str, Any] = {"schemas": {}, "enums": {}}
    registries = {}
    for label, (module, attribute) in REGISTRIES.items():
        registry = getattr(importlib.import_module(module), attribute)
        names = {}
        for name in registry:
            schema = registry.get(name).schema
            names[name] = _describe_class(schema, described) if schema is not None else None
        registries[label] = {"key": registry.key, "what": registry.what, "group": registry.group,
                             "name_field": registry.name_field, "names": names}
    return {"registries": registries, **described, "torchvision": importlib.metadata.version("torchvision"),
            "torchvision_models": sorted(torchvision.models.list_models())}


def torchvision_models() -> list[str] | None:
    """torchvision's model names as indexed, when the installed torchvision is the indexed one (else ``None``:
    its names are only known by importing it)."""
    from runner.config.registered import INDEX

    try:
        installed = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return None
    return INDEX["torchvision_models"] if installed == INDEX["torchvision"] else None


def _describe_class(cls: type, described: dict[str, Any]) -> str:
    """Record the dataclass ``cls`` (its dataclass bases, and the enums and dataclasses its fields name); its name."""
    if cls.__name__ not in described["schemas"]:
        bases = [base for base in cls.__bases__ if dataclasses.is_dataclass(base)]
        for base in bases:
            _describe_class(base, described)
        merged = dataclasses.make_dataclass("Bases", [], bases=tuple(bases)) if bases else None
        inherited = {spec[0]: spec for spec in _field_specs(merged, described)} if merged else {}
        described["schemas"][cls.__name__] = {  # the fields it adds, and those whose type or default it changes
            "bases": [base.__name__ for base in bases],
            "fields": [spec for spec in _field_specs(cls, described) if inherited.get(spec[0]) != spec]}
    return cls.__name__


def _field_specs(cls: type, described: dict[str, Any]) -> list[list]:
    """``[name, type, kind, default]`` of each field of ``cls``; kind: ``value``, ``factory`` or ``missing``."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        kind, default = ("missing", None)
        if f.default is not dataclasses.MISSING:
            kind, default = "value", _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            kind, default = "factory", _plain(f.default_factory())
        specs.append([f.name, _type_text(hints[f.name], described), kind, default])
    return specs


def _type_text(hint: Any, described: dict[str, Any]) -> str:
    """``hint`` written with the names ``_TYPE_NAMES`` and the recorded enums and dataclasses."""
    if hint is Any:
        return "Any"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return f"Optional[{_type_text(rest[0], described)}]"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_text(arg, described) for arg in args)}]"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        described["enums"][hint.__name__] = {member.name: member.value for member in hint}
        return hint.__name__
    if dataclasses.is_dataclass(hint):
        return _describe_class(hint, described)
    return hint.__name__


def _plain(value: Any) -> Any:
    """A default as plain data: an enum by its name, a dataclass as its fields."""
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def schemas(index: dict[str, Any]) -> dict[str, type]:
    """Each recorded schema rebuilt as a dataclass of the same name, fields, types and defaults."""
    built: dict[str, type] = {}

    class Names(dict):
        """The names a field's type is written with; a recorded dataclass is built when first named."""

        def __missing__(self, name: str) -> type:
            if name not in index["schemas"]:
                raise KeyError(name)
            schema = index["schemas"][name]
            bases = tuple(self[base] for base in schema["bases"])
            built[name] = dataclasses.make_dataclass(name, [_field(spec, self) for spec in schema["fields"]], bases=bases)
            self[name] = built[name]
            return built[name]

    names = Names(_TYPE_NAMES, **{name: enum.Enum(name, members) for name, members in index["enums"].items()})
    for name in index["schemas"]:
        names[name]  # noqa: B018 - builds it
    return built


def _field(spec: list, names: dict[str, Any]) -> tuple:
    name, text, kind, default = spec
    hint = eval(text, {"__builtins__": {}}, names)  # noqa: S307 - the index's own type names only
    if kind == "missing":
        return name, hint
    if kind == "value":
        return name, hint, dataclasses.field(default=default)
    if dataclasses.is_dataclass(hint):  # a nested schema's default: its fields' values (one level, as recorded)
        return name, hint, dataclasses.field(default_factory=lambda: hint(**_copy(default)))
    return name, hint, dataclasses.field(default_factory=lambda: _copy(default))


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, dict) else \
        [_copy(v) for v in value] if isinstance(value, list) else value


@functools.cache
def stand_ins() -> dict[str, Registry]:
    """A ``Registry`` per label of ``REGISTRIES`` holding the index's names (no builder, no schema):
    their ``get`` fails with the same line as the real one's. Stores each schema in Hydra's ConfigStore
    unless the real one is there already."""
    from runner.config.registered import INDEX

    built = schemas(INDEX)
    registries = {}
    for label, spec in INDEX["registries"].items():
        registry = Registry(spec["key"], spec["what"], spec["group"], spec["name_field"])
        for name, schema in spec["names"].items():
            registry.register(name)(None)  # the name alone: its schema is stored below, not held
            if schema and registry.group and not registry.stored(name):  # the real module's, once imported, stays
                registry.store(name, built[schema])
        registries[label] = registry
    return registries


def write(path: Path = INDEX_FILE) -> None:
    """Write the live index to ``path`` as a Python literal (read without any parser beyond Python's)."""
    text = pprint.pformat(live_index(), width=118, sort_dicts=True)
    path.write_text(f'"""Generated by ``python -m runner.config.index`` from the live registries: do not edit.\n\n'
                    f'``tests/test_startup.py`` checks it equals them."""\nINDEX = {text}\n')


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else INDEX_FILE)
