"""A sweep's jobs composed at the cost of one: each job still checked whole, as if alone.

Checking a sweep before any job runs composes and compiles every job. Hydra's compose was most of
that (a 64-job patching sweep of ``gpt2_tiny``, counted in CPU time per job: compose 138 ms,
``compile_plan`` 55 ms, of which building the meta model 17 ms): it reads and merges every preset
again for each job, though the jobs of a typical sweep differ from the first in one number.

``JobComposer`` composes the first job with Hydra and derives a job from it when every override
in which the two differ is one Hydra applies after the presets are merged, by replacing a value:
``key=value`` (no ``+``, ``~``, ``++``), a scalar value (not a dict or list, which Hydra *merges*
into what is there), a key the first job's config holds as a value (not a preset group such as
``model``, not ``hydra.*``), which no other override of the job also sets. Hydra sets such a key with
``OmegaConf.update(cfg, key, value, merge=True)`` onto the composed config; so does this, with
the value Hydra's own override parser reads (``1e-3`` a float, ``'3'`` a string). Anything else,
and any job whose value the config refuses (a type, a bound), is composed by Hydra as before, so
its error is Hydra's own line. ``check_command_line`` still compiles each job's plan in full
(typed checks, hooks, the rehearsal with that job's entries): a job that would fail alone fails.
A derived job says which values it replaced (``Composition.replaced``): its config merged into the
schema is the first job's with the same values replaced (``runner.engine.plan.Replaced``).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import NamedTuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.compose import CONF_DIR, compose_with_hydra, job_config

_ABSENT = object()


class Composition(NamedTuple):
    """One job composed: its config (``compose_job``'s), whether its launcher runs it elsewhere, and the
    composition whose ``hydra`` node it runs under (``hydra.run.dir``, the launcher, ...): Hydra's own for
    a job Hydra composed, the first job's for one derived from it (the two differ in values only)."""

    config: DictConfig
    remote: bool
    with_hydra: DictConfig
    #: a derived job's values replaced in the first job's config: ``(that config, ((key, value), ...))``
    replaced: tuple[DictConfig, tuple[tuple[str, object], ...]] | None = None


class JobComposer:
    """Composes the jobs of one sweep (``compose_job``'s result for each), deriving those it can from the first."""

    def __init__(self) -> None:
        self._parser = OverridesParser.create()
        self._first: tuple[list[str], DictConfig, bool] | None = None
        self.derived = 0  #: jobs derived from the first rather than composed by Hydra
        #: the first job's config as Hydra composed it, its ``hydra`` node kept (``hydra.run.dir``, ...):
        #: the command-line check looks there for a run already done, without composing it again
        self.first_with_hydra: DictConfig | None = None

    def compose(self, job: Sequence[str]) -> Composition:
        """``compose_job(job)``: derived from the first job when only replaced values differ, else Hydra's."""
        job = list(job)
        derived = self._derived(job) if self._first is not None else None
        if derived is not None:
            self.derived += 1
            return Composition(derived[0], self._first[2], self.first_with_hydra, (self._first[1], derived[1]))
        with_hydra = compose_with_hydra(job)
        cfg, remote = job_config(copy.deepcopy(with_hydra))
        if self._first is None:
            self.first_with_hydra = with_hydra
            self._first = (job, copy.deepcopy(cfg), remote)
        return Composition(cfg, remote, with_hydra)

    def _derived(self, job: list[str]) -> tuple[DictConfig, tuple[tuple[str, object], ...]] | None:
        first_job, first_cfg, _ = self._first
        if len(job) != len(first_job) or any(o.lstrip("+~").startswith("hydra.searchpath") for o in job):
            return None
        changed = [i for i, (mine, theirs) in enumerate(zip(job, first_job)) if mine != theirs]
        try:
            overrides = self._parser.parse_overrides([job[i] for i in changed])
        except HydraException:
            return None
        keys = [_key(o) for o in job]
        if not all(_replaces_a_value(o, first_cfg, keys, i) for o, i in zip(overrides, changed)):
            return None
        cfg = copy.deepcopy(first_cfg)
        values = tuple((override.key_or_group, override.value()) for override in overrides)
        try:
            for key, value in values:
                OmegaConf.update(cfg, key, value, merge=True)
        except (OmegaConfBaseException, ValueError, TypeError):  # Hydra composes it, and says why in its own line
            return None
        return cfg, values


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _is_group(key: str) -> bool:
    """A preset group (``model``, ``hooks``, ``hydra/launcher``): Hydra resolves it among the presets."""
    return "/" in key or key.startswith("hydra") or (CONF_DIR / key.replace(".", "/")).is_dir()


def _replaces_a_value(override: Override, cfg: DictConfig, keys: list[str], at: int) -> bool:
    """Whether Hydra applies ``override`` (at position ``at`` of the job) by replacing one value of ``cfg``."""
    key = override.key_or_group
    if override.type != OverrideType.CHANGE or override.package is not None or _is_group(key):
        return False
    value = override.value()
    if value is not None and not isinstance(value, (str, int, float, bool)):
        return False
    held = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False, throw_on_resolution_failure=False)
    if held is _ABSENT or isinstance(held, (DictConfig, ListConfig)):
        return False
    # no other override sets this key, a key inside it or one around it (a dict merged over it)
    return not any(other == key or other.startswith(f"{key}.") or key.startswith(f"{other}.")
                   for i, other in enumerate(keys) if i != at and not _is_group(other))
