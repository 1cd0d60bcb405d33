"""Import paths to a user's own functions (``fn``, ``pack``, ``unpack``), resolved before the run.

This is the one place besides a model's ``_target_`` where a config names code: importing the
module runs it, so it happens while the config is checked, and each mistake (no such module,
no such name, not callable, wrong number of arguments) is one ``ConfigError`` naming the key.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from common.errors import ConfigError, closest


#: The import paths ``resolve_callable`` was asked for inside ``resolved_paths()``; ``None`` outside it.
_RESOLVED: ContextVar[list[str] | None] = ContextVar("resolved_paths", default=None)


@contextlib.contextmanager
def resolved_paths() -> Iterator[list[str]]:
    """Yield the list of the import paths ``resolve_callable`` is asked for within: what the checks read of a
    user's code (``runner.attach`` keeps no plan that read any: the function may be redefined before the next block)."""
    found: list[str] = []
    token = _RESOLVED.set(found)
    try:
        yield found
    finally:
        _RESOLVED.reset(token)


def resolve_callable(path: object, key: str, nargs: int, called_as: str) -> Callable:
    """The callable that the dotted ``path`` names, checked to accept ``nargs`` positional arguments.

    ``path`` is ``package.module.function`` (or ``package.module.Class.method``): the longest
    importable module prefix is imported and the rest looked up as attributes. ``called_as``
    describes the call for the error message, e.g. ``"(module, args, output)"``.
    """
    if (asked := _RESOLVED.get()) is not None:
        asked.append(str(path))
    if not isinstance(path, str) or "." not in path.strip("."):
        raise ConfigError(f"{key}: {path!r} is not an import path; write module.function, e.g. mypkg.hooks.my_hook")
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise ConfigError(f"{key}: importing '{module_name}' failed: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
            raise ConfigError(f"{key}: importing '{module_name}' raised {type(exc).__name__}: {exc}") from None
        for depth, attr in enumerate(parts[i:]):
            if not hasattr(obj, attr):
                owner = ".".join(parts[:i + depth])
                hint = closest(attr, [n for n in dir(obj) if not n.startswith("_")], n=1)
                raise ConfigError(f"{key}: '{owner}' has no '{attr}'"
                                  + (f"; did you mean '{owner}.{hint[0]}'?" if hint else ""))
            obj = getattr(obj, attr)
        break
    else:
        raise ConfigError(f"{key}: no module '{parts[0]}' to import '{path}' from (is it installed, "
                          f"or on PYTHONPATH?)")
    if not callable(obj):
        raise ConfigError(f"{key}: '{path}' is a {type(obj).__name__}, not a function")
    _check_arity(obj, path, key, nargs, called_as)
    return obj


def _check_arity(fn: Callable, path: str, key: str, nargs: int, called_as: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: PyTorch will tell at the call
        return
    try:
        signature.bind(*([None] * nargs))
    except TypeError:
        raise ConfigError(f"{key}: '{path}{signature}' cannot be called as {called_as} "
                          f"({nargs} positional argument{'s' if nargs != 1 else ''})") from None
