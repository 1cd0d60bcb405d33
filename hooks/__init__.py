"""Hook types and their registry. Importing this package registers every built-in type."""
from common.errors import ConfigError
from hooks import (activation_store, attribution, backward, custom, dla, edits, gradients, interventions,  # noqa: F401
                   lens, observe, params, sae, saved, steer, units)  # registration side effects
from hooks.registry import HOOK_TYPES, build_hooks, register
from hooks.session import HookSession

__all__ = ["HOOK_TYPES", "ConfigError", "HookSession", "build_hooks", "register"]
