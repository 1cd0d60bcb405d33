"""The room of hook specs: one dataclass per hook type, importable without torch.

Each module here holds the specs of one family of types (mirroring ``hooks/observe.py``,
``gradients.py``, ``edits.py``, ...): the dataclass Hydra's ConfigStore stores as
``hook_schema/TYPE``, that the command line composes against before torch is imported, and that
``hooks.registry.build_hook`` merges an entry into and checks (``check``). Each module declares its
types: ``HOOK_TYPES.declare("clamp", "hooks.gradients", ClampSpec)``, the name, the spec and the
module whose ``@register("clamp")`` class implements it, imported only when an entry of that type
is built (SPEC 1's lazy loading). Importing this package declares every built-in type.

What may change here: a type's keys, their defaults and the checks that need neither torch nor a
stored file (those belong to the hook: ``HookType.check_spec``). What may not: an import of torch,
numpy, pyarrow, of ``runner``, or of ``hooks`` outside this room (``common`` is allowed);
``tests/test_layering.py`` holds these arrows.
"""
from hooks.specs import (activation_store, attribution, backward, custom, dla, edits, gradients,  # noqa: F401
                         interventions, lens, observe, params, sae, saved, steer, units)  # declarations
from hooks.specs.base import HOOK_TYPES, HookSpec

__all__ = ["HOOK_TYPES", "HookSpec"]
