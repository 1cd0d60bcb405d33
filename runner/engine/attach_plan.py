"""What a ``runner.attach`` block compiles from its arguments alone, compiled once while they and their
composition are unchanged.

A loop of attach blocks, or a notebook cell run again, asks for the same entries each time. What
they compile to without the model (the run settings, the built entries and the ``config.yaml`` text)
was two thirds of a block's CPU time: merging into the schemas and resolving are OmegaConf's slow
paths. It is kept by the block's arguments (only when they are plain data: names, numbers, lists and
mappings of them) and by the variables the checks read (the kernels' switch, torchrun's launch),
and reused only while ``compose_plain`` gives back the very composition it was compiled from: an
edited preset, another search path or a schema registered again is composed again, and so compiled
again. Not kept: a refused block, and entries whose checks read beyond the config (a stored run,
``stored_runs``, which may be replaced; a user's function, ``resolve_callable``, which may be
redefined). The model's own checks (``check_attached_model``, the first call's rehearsal) are made
by every block.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from omegaconf import OmegaConf

from hooks.kernels import native
from hooks.mechanism.base import HookType
from hooks.specs.callables import resolved_paths
from runner.config.compose import kept_composition
from runner.config.schema import RunConfig
from runner.engine.fsdp import LAUNCH_ENV
from runner.engine.plan import ATTACH_SETTINGS, attach_config, attach_lines, compile_hooks, compile_settings

#: The environment variables the settings' checks read: another value is another compile.
ENVIRONMENT = (native.SWITCH, *LAUNCH_ENV)


@dataclass(frozen=True)
class AttachPlan:
    """An attach block's checked settings, built entries (templates: each run attaches ``fresh`` ones),
    ``config.yaml`` text and the command lines they stand for."""

    settings: RunConfig
    hooks: tuple[HookType, ...]
    config_yaml: str
    overrides: tuple[str, ...]
    #: ``hooks`` are a kept plan's, the same objects for every block of the same arguments and composition
    #: (``runner.engine.rehearsal`` keeps the first call's rehearsal by them)
    kept: bool = False


#: Compiled plans by their arguments, with the composition each was compiled from; the newest last.
_COMPILED: dict[tuple, tuple[object, AttachPlan]] = {}
_COMPILED_KEPT = 64


def attach_plan(hooks, overrides: Sequence[str], settings: dict, logger) -> AttachPlan:
    """The block's plan: compiled, or the one compiled for the same arguments from the same composition.

    Raises:
        ConfigError: as ``attach_config``, ``compile_settings`` and ``compile_hooks``.
    """
    key = _plain((hooks, tuple(overrides), settings, logger, tuple(map(os.environ.get, ENVIRONMENT))))
    held = _COMPILED.pop(key, None) if key is not None else None
    if held is not None and kept_composition(attach_lines(hooks, overrides, logger)) is held[0]:
        _COMPILED[key] = held
        return _copied(held[1], kept=True)
    with resolved_paths() as code:
        cfg, lines = attach_config(hooks, overrides, settings, logger)
        typed, s = compile_settings(cfg, lines)
        plan = AttachPlan(s, compile_hooks(typed), _config_yaml(typed), tuple(lines))
    composed = kept_composition(lines)  # None if a file changed since it was composed: that plan is not kept
    if key is not None and composed is not None and not code and not any(hook.stored_runs for hook in plan.hooks):
        _COMPILED[key] = (composed, plan)
        while len(_COMPILED) > _COMPILED_KEPT:
            del _COMPILED[next(iter(_COMPILED))]
        return _copied(plan, kept=True)
    return _copied(plan)


def _config_yaml(typed) -> str:
    """The ``config.yaml`` of an attach block: the settings that mean something in a user's loop, the entries, the loggers."""
    return OmegaConf.to_yaml(OmegaConf.masked_copy(typed, [*ATTACH_SETTINGS, "hooks", "logger"]), resolve=True)


def _copied(plan: AttachPlan, kept: bool = False) -> AttachPlan:
    """``plan`` with settings of its own: a run may change its copy, never the kept one."""
    return AttachPlan(copy.deepcopy(plan.settings), plan.hooks, plan.config_yaml, plan.overrides, kept)


def _plain(value) -> tuple | None:
    """``value`` as a key of its types and contents (mappings in their order: the entries' order is the
    run's), or ``None`` when it holds anything but plain data (an object's state is not in its repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return type(value), value
    if isinstance(value, Mapping):
        items = [(_plain(k), _plain(v)) for k, v in value.items()]
        return None if any(k is None or v is None for k, v in items) else (type(value), tuple(items))
    if isinstance(value, Sequence):
        items = [_plain(v) for v in value]
        return None if any(v is None for v in items) else (type(value), tuple(items))
    return None
