"""Hook types and their registry. Importing this package declares every built-in type (``hooks.specs``,
no torch); a type's implementation is imported when an entry of it is built."""
from common.errors import ConfigError
from hooks.specs import HOOK_TYPES

#: Names read from the modules that import torch, imported when first asked for (PEP 562).
_LAZY = {"build_hooks": "hooks.mechanism.registry", "register": "hooks.mechanism.registry", "HookSession": "hooks.mechanism.session"}

__all__ = ["HOOK_TYPES", "ConfigError", "HookSession", "build_hooks", "register"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hooks' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
