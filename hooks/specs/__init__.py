"""The room of hook specs: one dataclass per hook type, importable without torch.

Each module here holds the specs of one family of types (mirroring ``hooks/types/observe.py``,
``gradients.py``, ``edits.py``, ...): the dataclass Hydra's ConfigStore stores as
``hook_schema/TYPE``, that the command line composes against before torch is imported, and that
``hooks.mechanism.registry.build_hook`` merges an entry into and checks (``check``). Each module declares its
types: ``HOOK_TYPES.declare("clamp", "hooks.types.gradients", ClampSpec)``, the name, the spec and the
module whose ``@register("clamp")`` class implements it, imported only when an entry of that type
is built (SPEC 1's lazy loading). Importing this package imports every module of the room, so it
declares every built-in type, a family added here included (``declare_all``).

What may change here: a type's keys, their defaults and the checks that need neither torch nor a
stored file (those belong to the hook: ``HookType.check_spec``). What may not: an import of torch,
numpy, pyarrow, of ``runner``, or of ``hooks`` outside this room (``common`` is allowed);
``tests/test_layering.py`` holds these arrows.
"""
import importlib
import pkgutil

from hooks.specs.base import HOOK_TYPES, HookSpec

__all__ = ["HOOK_TYPES", "HookSpec", "declare_all"]


def declare_all() -> None:
    """Import every module of this room (each declares its family's types); a module imported already is not run again."""
    for found in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{found.name}")


declare_all()
