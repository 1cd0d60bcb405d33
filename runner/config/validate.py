"""Checks of a composed config that Hydra cannot make, run before anything is built or written.

Hydra's struct mode rejects a misspelled key only when it is not prefixed with ``+``; ``+typo=1``,
``+model.widht=3`` or ``+data.shuffle=1`` are carried along silently and would make an
experiment quietly differ from what was meant. Here every key must be one the config files
(``conf/``) or the model's constructor know, every number must be a number, and the run
settings must be among their choices. Each failure is one ``ConfigError`` naming the full key.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from hooks.errors import ConfigError, choice_error
from runner.sources.models import RUN_KEYS
from runner.engine.nonfinite import POLICIES

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: Top-level keys that Hydra adds or that are not settings of the run.
_NOT_SETTINGS = ("defaults", "hydra")


@lru_cache(maxsize=None)
def top_level_keys() -> frozenset[str]:
    """Keys ``conf/config.yaml`` defines or composes (its settings and its default groups)."""
    main = OmegaConf.load(CONF_DIR / "config.yaml")
    keys = {str(k) for k in main.keys() if k not in _NOT_SETTINGS}
    for entry in main.get("defaults", []):
        if isinstance(entry, (Mapping, DictConfig)):
            keys.update(str(k) for k in entry.keys())
    return frozenset(keys)


@lru_cache(maxsize=None)
def _group_keys(group: str, kind: str | None = None) -> frozenset[str]:
    """Union of the keys of the ``conf/GROUP/*.yaml`` options (only those of ``kind`` if given)."""
    keys: set[str] = set()
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        option = OmegaConf.load(path)
        if kind is None or option.get("kind") == kind:
            keys.update(str(k) for k in option.keys())
    return frozenset(keys)


def _unknown_keys(keys: Iterable, prefix: str, known: Iterable[str], what: str) -> None:
    known = sorted(known)
    for key in keys:
        if str(key) not in known:
            raise choice_error(f"{prefix}{key}", key, known, what)


def _integer(cfg: DictConfig, key: str, minimum: int | None = None) -> int:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: {value!r} is not an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}: {value} must be at least {minimum}")
    return value


def check_config(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """Reject every mistake visible in ``cfg`` and the command line alone (no model, no data).

    Raises:
        ConfigError: naming the first bad key, its value and the fix.
    """
    _unknown_keys([k for k in cfg.keys() if k != "hydra"], "", top_level_keys(), "setting")  # hydra: a sweep's
    _integer(cfg, "seed")
    _integer(cfg, "steps", minimum=1)
    if cfg.mode not in ("train", "eval"):
        raise choice_error("mode", cfg.mode, ("train", "eval"), "mode")
    if cfg.on_nonfinite not in POLICIES:
        raise choice_error("on_nonfinite", cfg.on_nonfinite, POLICIES, "policy")
    if not isinstance(cfg.overwrite, bool):
        raise ConfigError(f"overwrite: {cfg.overwrite!r} must be true or false")
    if "_target_" not in cfg.model.keys():  # a constructor takes any key; a named model only these
        _unknown_keys(cfg.model.keys(), "model.", RUN_KEYS, f"key for model '{cfg.model.get('name')}'")
    kind = cfg.data.get("kind")
    data_keys = _group_keys("data", str(kind))
    if data_keys:  # an unknown kind is reported by runner.data with the valid kinds
        _unknown_keys(cfg.data.keys(), "data.", data_keys, f"key for data kind '{kind}'")
    _unknown_keys(cfg.loss.keys(), "loss.", _group_keys("loss"), "key for losses")
    _check_targets(cfg)
    _check_repeated_presets(overrides)


def _check_targets(cfg: DictConfig) -> None:
    """Class targets must be classes of the model: cross_entropy fails mid-run otherwise."""
    given, classes = cfg.data.get("targets"), cfg.model.get("num_classes")
    if given is None or classes is None:
        return
    values = [given] if isinstance(given, int) else list(given)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < int(classes):
            raise ConfigError(f"data.targets: {value!r} is not a class of a model with "
                              f"num_classes={classes}; use integers in [0, {int(classes) - 1}]")


def _check_repeated_presets(overrides: Sequence[str]) -> None:
    """``hooks=[clip,clip]`` composes one ``clip`` entry: the second is silently lost."""
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if o.lstrip("+~").startswith("hooks=")])
    except HydraException:
        return  # Hydra has already accepted the command line; anything odd here is not ours to judge
    for override in parsed:
        if override.is_sweep_override():
            continue
        value = override.value()
        if isinstance(value, list):
            seen: set[str] = set()
            for name in map(str, value):
                if name in seen:
                    raise ConfigError(f"hooks: preset '{name}' is listed twice in {override.input_line}; "
                                      f"each preset adds the one entry hooks.{name}: list it once, or add a "
                                      f"second entry under a new name (+hooks.{name}_2.type=...)")
                seen.add(name)

