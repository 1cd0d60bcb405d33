"""Module selection shared by every hook type: names, globs, ``re:``, ``type:`` and ``leaf:``.

A selector is a string or a list of strings; each string is one of

* an exact qualified name (``layer4.0.conv1``; ``""`` is the model itself),
* a glob where ``*`` stays inside one dotted segment and ``**`` spans any number of them
  (``layer*.*.conv*``; ``*`` alone is the direct children, ``**`` every module and the model
  itself; no other glob matches the model itself),
* ``re:PATTERN``, a regular expression that must match the whole name,
* ``type:CLASS``, modules whose class name (or ``module.Class`` path) is CLASS,
* ``leaf:SELECTOR``, the modules matched by SELECTOR that have no children,
* a canonical name of the model's family (``blocks.*``, ``blocks.3.attn``, ``blocks.*.mlp``, ``ln_final``,
  ``unembed``; globs as above; see ``hooks.mechanism.families``), when no module's own name matches it and the model
  is a Hugging Face one (``config.model_type``): the same selector then reads every transformer family, and
  a module's own path still wins.

The result keeps ``model.named_modules()`` order and lists each module once, even when it is
reachable under two names or matched by two strings. A string that matches nothing is an error
that suggests the closest names: a silent no-op would make an experiment measure nothing.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from common.errors import ConfigError, closest
from hooks.mechanism.families import model_type, vocabulary


def _glob_to_regex(glob: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append(r"[^.]*")
            i += 1
        elif glob[i] == "?":
            out.append(r"[^.]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


#: Prefixes wrappers put before the names of the modules they wrap (``torch.compile``, DDP and
#: ``DataParallel``, FSDP1, activation checkpointing): a name copied from a wrapped model's printout.
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _unwrapped(pattern: str, names: list[str]) -> list[str]:
    """The names ``pattern`` stands for once a wrapper's prefix is taken off it or put before it."""
    stripped = pattern
    while stripped.startswith(WRAPPER_PREFIXES):
        stripped = stripped.split(".", 1)[1]
    candidates = [stripped, *(prefix + pattern for prefix in WRAPPER_PREFIXES)]
    return [c for c in dict.fromkeys(candidates) if c != pattern and c in names]


def _class_names(module: nn.Module) -> tuple[str, str]:
    cls = type(module)
    return cls.__name__, f"{cls.__module__}.{cls.__qualname__}"


def _match_one(pattern: str, modules: list[tuple[str, nn.Module]], key: str) -> list[str]:
    """Names matched by one selector string; raises ConfigError when it matches nothing."""
    names = [n for n, _ in modules]
    if pattern.startswith("leaf:"):
        inner = _match_one(pattern[len("leaf:"):], modules, key)
        by_name = dict(modules)
        hits = [n for n in inner if not any(True for _ in by_name[n].children())]
        if not hits:
            raise ConfigError(f"{key}: '{pattern}' matched modules but none of them is a leaf "
                              f"(a module without children); drop 'leaf:' or select deeper")
        return hits
    if pattern.startswith("type:"):
        cls = pattern[len("type:"):]
        hits = [n for n, m in modules if cls in _class_names(m)]
        if not hits:
            present = sorted({_class_names(m)[0] for _, m in modules})
            hint = closest(cls, present, n=1)
            raise ConfigError(f"{key}: no module of class '{cls}'; classes in this model: "
                              f"{', '.join(present)}" + (f"; did you mean 'type:{hint[0]}'?" if hint else ""))
        return hits
    if pattern.startswith("re:"):
        try:
            rx = re.compile(pattern[len("re:"):])
        except re.error as exc:
            raise ConfigError(f"{key}: invalid regular expression '{pattern}': {exc}") from None
    elif any(ch in pattern for ch in "*?"):
        rx = _glob_to_regex(pattern)
    else:
        rx = None
    if rx is None:
        hits = [n for n in names if n == pattern]
    else:  # the root ("") is matched only by "" and "**"
        hits = [n for n in names if (n or pattern == "**" or pattern.startswith("re:")) and rx.fullmatch(n)]
    if not hits:
        hint = list(dict.fromkeys(_unwrapped(pattern, names) + closest(pattern, [n for n in names if n], n=3)))[:3]
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConfigError(f"{key}: '{pattern}' matches no module"
                          + (f"; did you mean {', '.join(repr(h) for h in hint)}?" if hint else "")
                          + f" (module names: {shown}; plan=true lists them all)")
    return hits


#: The first segments of the canonical names (``hooks.mechanism.families``).
CANONICAL_ROOTS = ("blocks", "embed", "pos_embed", "ln_final", "unembed")


def _canonical(pattern: str, model: nn.Module, key: str) -> list[str] | None:
    """The module names a canonical ``pattern`` stands for in ``model``'s family; None when ``pattern`` is
    not canonical or the model has no Hugging Face ``model_type`` (a model of the user's own, whose own
    names the missed selector meant); one line when the family is unknown or lacks the name."""
    if pattern.split(".", 1)[0] not in CANONICAL_ROOTS or model_type(model) is None:
        return None
    vocab = vocabulary(model, key)
    names = vocab.names
    rx = _glob_to_regex(pattern)
    hits = [real for canonical, real in names.items() if rx.fullmatch(canonical)]
    if not hits:
        hint = closest(pattern, list(names), n=1)
        first_block = [n for n in names if not re.match(r"blocks\.[1-9]", n)]  # block 0 stands for every block
        raise ConfigError(f"{key}: '{pattern}' is neither a module of this model nor a name of its family's "
                          f"vocabulary ({vocab.family}: {', '.join(first_block)}, ...)"
                          + (f"; did you mean '{hint[0]}'?" if hint else ""))
    return hits


def select_modules(model: nn.Module, selector: str | Sequence[str], key: str) -> list[tuple[str, nn.Module]]:
    """Resolve ``selector`` against ``model`` into ``(qualified_name, module)`` pairs.

    Args:
        model: the model whose modules are searched.
        selector: one selector string or a list of them (see the module docstring).
        key: the config path of the selector, used in error messages (``hooks.clip.layers``).

    Example:
        >>> [n for n, _ in select_modules(resnet, "layer1.*.conv1", "hooks.x.layers")]
        ['layer1.0.conv1', 'layer1.1.conv1']
    """
    patterns = [selector] if isinstance(selector, str) else list(selector)
    if not patterns:
        raise ConfigError(f"{key}: empty selector; name at least one module (e.g. '**' for all, "
                          f"'leaf:**' for every leaf, '*' for the direct children)")
    modules = list(model.named_modules(remove_duplicate=False))
    wanted: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, int):  # Hydra turns layers=[4] into an int: nn.Sequential's "4"
            pattern = str(pattern)
        if not isinstance(pattern, str):
            raise ConfigError(f"{key}: selector entries must be strings, got {pattern!r}")
        try:
            wanted.update(_match_one(pattern, modules, key))
        except ConfigError:
            hits = _canonical(pattern, model, key)
            if hits is None:
                raise
            wanted.update(hits)
    wanted_ids = {id(m) for n, m in modules if n in wanted}
    chosen: dict[int, tuple[str, nn.Module]] = {}
    for name, module in modules:  # one entry per module object, under its first name
        if id(module) in wanted_ids and id(module) not in chosen:
            chosen[id(module)] = (name, module)
    return list(chosen.values())
