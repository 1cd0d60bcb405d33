"""What a config's ``_target_`` may name: imported, checked to build the promised kind, never called blindly.

A config names code to run. ``model._target_`` and ``data._target_`` may name only what builds
their kind (an ``nn.Module``, a ``Dataset``): a subclass of it, or a callable whose return
annotation is one. The keys given must be arguments the target takes. Both checks happen
before anything is called, so ``builtins.open`` or ``os.makedirs`` are refused without running.
"""
from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Iterable

from common.errors import ConfigError, choice_error


def locate(path: str, key: str) -> object:
    """The object a dotted path names (``pkg.mod.Class.method``), imported but not called.

    Raises:
        ConfigError: naming ``key``, when no module of the path imports or it lacks the attribute.
    """
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:cut]).startswith(exc.name):
                raise ConfigError(f"{key}: importing '{path}' failed: {exc}") from None
            continue
        except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
            raise ConfigError(f"{key}: importing '{path}' failed: {type(exc).__name__}: {exc}") from None
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ConfigError(f"{key}: '{'.'.join(parts[:cut])}' has no '{'.'.join(parts[cut:])}'") from None
        return obj
    raise ConfigError(f"{key}: cannot import '{path}': no module named '{parts[0]}'")


def builds(target: object, base: type) -> bool:
    """Whether ``target`` is a subclass of ``base`` or a callable annotated to return one."""
    if inspect.isclass(target):
        return issubclass(target, base)
    try:
        returned = typing.get_type_hints(target).get("return")
    except Exception:  # noqa: BLE001 - unresolvable annotations: no promise of a ``base``
        return False
    return inspect.isclass(returned) and issubclass(returned, base)


def check_arguments(target: object, path: str, keys: Iterable[str], prefix: str) -> None:
    """Each of ``keys`` is an argument ``target`` takes (``prefix`` + key names it in the error)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    for key in keys:
        if key not in params:
            raise choice_error(f"{prefix}{key}", key, [*params] or ["(none)"], f"argument of '{path}'")
