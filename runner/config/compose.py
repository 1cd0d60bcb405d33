"""Composing a job's config with Hydra's compose API: ``compose_config(overrides)`` is what
``python -m runner OVERRIDES`` runs, for the command line's checks, ``runner.attach`` and tests alike.

Hydra reports its own composition errors (``hooks=clp``, ``model=resnet19``, ``hooks.clip.maxx=1``,
``step=3``, ``mode=trian``) in several lines, advises ``+`` for a misspelled key, and exits 1;
here each becomes the runner's one line (the key, the valid choices, the closest). Presets beyond
``conf/`` are found through Hydra's search path (``hydra.searchpath=[file:///my/conf]``). The schemas
presets inherit are the real ones, stored by modules importing no torch: the hook types' by
``hooks.specs``, the other choices' by ``runner.config.registry``, the loggers' by ``runner.live``'s
modules (imported when the command line names a logger): composing imports neither torch nor a
hook type's implementation.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException, ValidationError
import yaml

from common.errors import ConfigError, choice_error
import hooks.specs  # noqa: F401  (stores the hook types' schemas, hook_schema/clamp, ...)
import runner.config.registry  # noqa: F401  (stores the built-in choices' schemas, data_schema/randn, ...)
import runner.config.schema  # noqa: F401  (stores the schemas the presets inherit from)
import runner.config.slurm  # noqa: F401  (stores the Slurm presets' schema)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: Launchers whose jobs run on other machines: CUDA is checked on the job's node, not here.
_REMOTE_LAUNCHERS = ("SlurmLauncher",)
_WHAT = {"mode": "mode", "device": "device", "on_nonfinite": "policy", "on_silent": "policy"}


def compose_job(overrides: Sequence[str]) -> tuple[DictConfig, bool]:
    """The config ``python -m runner OVERRIDES`` runs, and whether its launcher runs it elsewhere.

    Raises:
        ConfigError: Hydra could not compose it; one line naming the key or the preset.
    """
    return job_config(compose_with_hydra(overrides))


def job_config(cfg: DictConfig) -> tuple[DictConfig, bool]:
    """``compose_job``'s result from Hydra's composed ``cfg`` (whose ``hydra`` node it drops)."""
    launcher = str(OmegaConf.select(cfg, "hydra.launcher._target_", default="") or "")
    _check_required(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, launcher.endswith(_REMOTE_LAUNCHERS)


def compose_with_hydra(overrides: Sequence[str]) -> DictConfig:
    """The job's config with Hydra's own node (``hydra.run.dir``, ``hydra.sweep.dir``, ...), unchecked.

    Raises:
        ConfigError: Hydra could not compose it; one line naming the key or the preset.
    """
    if any(o.lstrip("+~").startswith("logger") for o in overrides):  # presets inherit logger_schema/NAME
        from runner.live.config import register_backends  # numpy and pyarrow, not torch: only when named

        register_backends()
    try:
        _check_keys_and_presets(overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except OverrideParseException as exc:
        raise ConfigError(parse_error(exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise explain(exc, overrides) from None
    except yaml.YAMLError as exc:  # a config file that is not YAML: name the file and the line
        raise ConfigError(_yaml_error(exc)) from None


def _check_keys_and_presets(overrides: Sequence[str]) -> None:
    """What Hydra's compose raises a bare ``ValueError`` for, in one line: an override without a key
    (``=1``), and a preset group given a value that is not a preset name (``model=1``, ``hooks=[1]``)."""
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element().lstrip("+~")
        if override.is_delete() or override.is_sweep_override():
            continue
        value = override.value()
        if not key:
            raise ConfigError(f"'{override.input_line}': no key before '='; write KEY=VALUE, e.g. steps=1")
        names = value if isinstance(value, list) else [value]
        bad = next((json.dumps(name) for name in names if not isinstance(name, str)), None)
        if bad is None:
            continue
        if "/" in key:  # only a config group's key has a '/' (hydra/launcher)
            raise ConfigError(f"{key}: {bad} is not a preset name")
        if (CONF_DIR / key).is_dir():
            raise choice_error(key, bad, _presets(key), "preset")


class LauncherError(ConfigError):
    """A mistake in ``hydra.launcher``: shared by every job of the sweep."""


def _check_required(cfg: DictConfig) -> None:
    """A launcher preset's ``???`` values (``hydra.launcher.partition``) must be given on the command line."""
    node = OmegaConf.select(cfg, "hydra.launcher")
    missing = [key for key in (node or {}) if OmegaConf.is_missing(node, key)]
    if missing:
        preset = OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/launcher")
        raise LauncherError(f"hydra.launcher.{missing[0]}: required by hydra/launcher={preset}; give it, e.g. "
                          f"hydra.launcher.{missing[0]}=NAME" + (" (sinfo lists the partitions)"
                                                                 if missing[0] == "partition" else ""))


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """``compose_job`` without the launcher: the job config tests and notebooks compose."""
    return compose_job(overrides)[0]


class _Composition(NamedTuple):
    """A composed job config as plain containers, and what its composition read."""

    plain: dict
    sources: tuple[str, ...]  #: the search path's directories (``hydra.runtime.config_sources`` of schema file)
    inputs: tuple | None  #: the YAML files of ``sources`` and ``registered`` by id; ``None``: not known, compose again
    registered: tuple  #: the ConfigStore nodes ``inputs`` names by id, held so that no id is reused


#: Compositions by their overrides, the newest last; at most ``_COMPOSITIONS_KEPT``.
_COMPOSED: dict[tuple[str, ...], _Composition] = {}
_COMPOSITIONS_KEPT = 64


def compose_plain(overrides: Sequence[str]) -> dict:
    """``compose_config(overrides)`` as plain containers (enums as strings), composed by Hydra once for the
    same ``overrides`` while what it read is unchanged: every YAML file of its search path (by contents),
    the search path itself (a directory of ``hydra.searchpath`` is among the overrides or in a file), and
    the schemas registered in Hydra's ConfigStore. ``runner.attach`` composes through it, so a loop of
    attach blocks or a notebook cell run again pays Hydra once, and an edited preset is composed again.

    Raises:
        ConfigError: as ``compose_config``; a refused composition is not kept.
    """
    key = tuple(overrides)
    held = _COMPOSED.pop(key, None)
    sources = held.sources if held is not None else _search_path(key)
    files = _yaml_files(sources)  # taken before composing: a file edited meanwhile is composed again next time
    if held is None or held.inputs != (files, tuple(map(id, _registered()))):
        cfg = compose_with_hydra(key)
        read = tuple(str(source.path) for source in cfg.hydra.runtime.config_sources if source.schema == "file")
        plain = OmegaConf.to_container(job_config(cfg)[0], enum_to_str=True)
        registered = _registered()  # after: composing stores the static index's schemas not registered yet
        # the search path is known once composed: taken on another one, the fingerprint is not this one's
        held = _Composition(plain, read, (files, tuple(map(id, registered))) if read == sources else None, registered)
    _COMPOSED[key] = held
    while len(_COMPOSED) > _COMPOSITIONS_KEPT:
        del _COMPOSED[next(iter(_COMPOSED))]
    return copy.deepcopy(held.plain)


def kept_composition(overrides: Sequence[str]) -> _Composition | None:
    """The composition ``compose_plain`` keeps for ``overrides`` while what it read is unchanged, else ``None``;
    it never composes (what is compiled from a composition is kept as long as it is: ``runner.engine.attach_plan``)."""
    held = _COMPOSED.get(tuple(overrides))
    unchanged = held is not None and held.inputs == (_yaml_files(held.sources), tuple(map(id, _registered())))
    return held if unchanged else None


def _search_path(overrides: Sequence[str]) -> tuple[str, ...]:
    """The directories a composition of ``overrides`` reads presets from, as far as they say it: ``conf/``
    and the ``file://`` entries of ``hydra.searchpath`` (one that ``config.yaml`` adds is known once composed)."""
    found = [str(CONF_DIR)]
    for line in overrides:
        if line.lstrip("+~").startswith("hydra.searchpath="):
            with contextlib.suppress(HydraException):
                entries = OverridesParser.create().parse_override(line).value()
                found += [e[len("file://"):] for e in entries if isinstance(e, str) and e.startswith("file://")]
    return tuple(found)


def _yaml_files(directories: Sequence[str]) -> tuple[tuple[str, bytes], ...]:
    """Every ``.yaml`` file under ``directories`` with its contents, in a fixed order."""
    found = []
    for directory in directories:
        for root, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(root, name)
                if name.endswith((".yaml", ".yml")):
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile: not read
                        found.append((path, _contents(path)))
    return tuple(sorted(found))


#: Each YAML file's contents as last read, with the ``os.stat`` fields they were read under.
_READ: dict[str, tuple[tuple[int, ...], bytes]] = {}
#: A file last changed longer ago than this (ns) when it was read is taken as read while its stat holds.
_SETTLED_NS = 2_000_000_000


def _contents(path: str) -> bytes:
    """The file's bytes, read again only when its stat changed (modification and change times, size, inode,
    device: 0.4 ms for ``conf/`` where reading it is 1 ms). A file changed less than ``_SETTLED_NS`` before
    it was read is read every time: an edit within the file system's clock tick keeps the time, and may
    keep the size (git's "racily clean" entries)."""
    stat = os.stat(path)
    fields = (stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino, stat.st_dev)
    held = _READ.get(path)
    if held is not None and held[0] == fields:
        return held[1]
    with open(path, "rb") as f:
        data = f.read()
    if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > _SETTLED_NS:
        _READ[path] = (fields, data)
    else:
        _READ.pop(path, None)
    return data


def _registered() -> tuple:
    """Every node in Hydra's ConfigStore (a schema registered, or stored again, is a new node)."""
    nodes, pending = [], [ConfigStore.instance().repo]
    while pending:
        for name, value in sorted(pending.pop().items()):
            (pending if isinstance(value, dict) else nodes).append(value)
    return tuple(nodes)


def explain(exc: Exception, overrides: Sequence[str]) -> ConfigError:
    """Hydra's composition error as the runner's one line."""
    if isinstance(exc, MissingConfigException):
        return _missing_preset(exc)
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) and exc.__cause__ else exc
    text = str(exc)
    if "Ambiguous value for argument" in text:
        arg = re.search(r"argument '([^']*)'", text)
        return ConfigError(f"{arg.group(1) if arg else 'override'}: a comma in a value makes a sweep; add -m to "
                           f"sweep, or write a list as key=[a,b]")
    key = str(getattr(cause, "full_key", "") or "")
    value = _value_of(key, overrides)
    if isinstance(cause, ValidationError) and key:
        return _bad_value(key, value, cause)
    if key and "Could not override" in text:
        return _unknown_key(key, text, overrides)
    first = text.splitlines()[0] if text else type(exc).__name__
    return ConfigError(f"{key}: {first}" if key else first)


def _missing_preset(exc: MissingConfigException) -> ConfigError:
    found = re.search(r"Could not (?:find|load) '([^']*)'", str(exc))  # load: a name in a list, hooks=[a,b]
    if not found:
        return ConfigError(str(exc).splitlines()[0])
    group, _, name = found.group(1).rpartition("/")
    options = exc.options or _presets(group)
    if not group:
        return ConfigError(f"unknown config '{name}'")
    return choice_error(group, name, options, "preset")


def _presets(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


#: What ``OmegaConf.select`` gives for a key the config does not have (``None`` is a null value).
_ABSENT = object()


def _unknown_key(key: str, text: str, overrides: Sequence[str]) -> ConfigError:
    """``Could not override 'K'``: the last existing node of ``K`` lacks the next part."""
    wanted = re.search(r"Could not override '([^']*)'", text)
    wanted_key = wanted.group(1) if wanted else key
    parent, _, missing = key.rpartition(".")
    if parent == "hooks" and wanted_key != key:  # hooks.clip.max=... without hooks=clip
        hint = (f"add the preset: hooks={missing}, or list it: 'hooks=[...,{missing}]'"
                if missing in _presets("hooks") else f"presets: {', '.join(_presets('hooks'))}")
        return ConfigError(f"{wanted_key}: there is no entry hooks.{missing} in this config; {hint}")
    rest = [o for o in overrides if o.lstrip("+~").split("=")[0] != wanted_key]
    try:
        cfg = compose_config(rest)
        node = OmegaConf.select(cfg, parent, default=_ABSENT) if parent else cfg
        known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    except ConfigError:
        node, known = _ABSENT, []
    if node is None:  # a null mapping such as hooks.patch.clean: Hydra sets no key inside it
        return ConfigError(f"{key}: {parent} is null, so it has no '{missing}' to set; give the mapping whole: "
                           f"'{parent}={{{missing}: {_value_of(wanted_key, overrides)}}}'")
    what = "setting" if not parent else f"key of {parent}"
    return choice_error(key, missing, known or ["(none)"], what)


def _bad_value(key: str, value: object, cause: ValidationError) -> ConfigError:
    message = str(cause).splitlines()[0]
    choices = re.search(r"expected one of \[([^\]]*)\]", message)
    if choices:
        bad = re.search(r"Invalid value '([^']*)'", message)
        return choice_error(key, bad.group(1) if bad else value,
                            [c.strip() for c in choices.group(1).split(",")], _WHAT.get(key.split("[")[0], "value"))
    if "valid bool" in message or "to Boolean" in message:
        return ConfigError(f"{key}: {value!r} must be true or false")
    if "to Integer" in message or "to int" in message:
        return ConfigError(f"{key}: {value!r} is not an integer")
    if "to Float" in message:
        return ConfigError(f"{key}: {value!r} is not a number")
    if "is not a ListConfig" in message:
        return ConfigError(f"{key}: {value!r} must be a list, e.g. {key}=[1,2]")
    return ConfigError(f"{key}: {message}")


def _value_of(key: str, overrides: Sequence[str]) -> object:
    """The value the command line gave ``key``, as Hydra parses it (``1.5``, ``'abc'``; ``shape[1]``: an item)."""
    indexed = re.fullmatch(r"(.*)\[(\d+)\]", key)
    if indexed:
        whole = _value_of(indexed.group(1), overrides)
        index = int(indexed.group(2))
        return whole[index] if isinstance(whole, list) and index < len(whole) else None
    for line in overrides:
        if line.lstrip("+~").split("=")[0] == key:
            try:
                return OverridesParser.create().parse_override(line).value()
            except HydraException:
                return line.partition("=")[2]
    return None


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    where = f"{mark.name}, line {mark.line + 1}" if mark is not None else "config file"
    return f"{where}: {problem}" + (f" ({' '.join(context.split())})" if context else "")


def parse_error(exc: OverrideParseException) -> str:
    return f"cannot parse '{exc.override}': {str(exc).splitlines()[0]}"
