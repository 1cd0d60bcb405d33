"""One schema merge for every typed node of a config: a hook entry (``hooks.mechanism.registry``), a model, data or
optimizer node (``runner.engine.plan``), a live logger's settings (``runner.live.config``).

``merged`` names a key the schema lacks, with the valid keys and the closest one, and turns
OmegaConf's ill-typed value into one line naming the full key.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.errors import ConfigError, choice_error


def merged(schema: type, node: Mapping | DictConfig | object | None, key: str, what: str = "key") -> DictConfig:
    """``node`` merged into the dataclass ``schema``; ``key`` is the node's full config path.

    Raises:
        ConfigError: a key ``schema`` lacks (``KEY.k: unknown WHAT 'k'; valid: ...``), or a value of another type.
    """
    known_keys(schema, node, f"{key}.", what)
    with _one_line(key):
        return OmegaConf.merge(schema_template(schema), node or {})


@functools.cache
def schema_template(schema: type) -> DictConfig:
    """``OmegaConf.structured(schema)``, built once per class: building it is most of a small merge's cost
    (9 of 17 ms for ``RunConfig``), and ``OmegaConf.merge`` copies its first config before merging into it,
    so the one kept here is never changed. Only ever pass it to ``OmegaConf.merge`` as the first config."""
    return OmegaConf.structured(schema)


def merged_object(schema: type, node: Mapping | DictConfig | object | None, key: str, what: str = "key") -> object:
    """``merged`` as a ``schema`` object: a mandatory field left unset (``???``) is one line naming it too."""
    config = merged(schema, node, key, what)
    with _one_line(key):
        return OmegaConf.to_object(config)


@contextlib.contextmanager
def _one_line(key: str) -> Iterator[None]:
    """OmegaConf's error inside as one ``ConfigError`` line naming the full key (``KEY.sub: reason``)."""
    try:
        yield
    except OmegaConfBaseException as exc:
        sub = getattr(exc, "full_key", "") or ""
        raise ConfigError(f"{key}{'.' + sub if sub else ''}: {str(exc).splitlines()[0]}") from None


def known_keys(schema: type, node: Mapping | DictConfig | object | None, prefix: str, what: str = "key") -> None:
    """Each key of ``node`` is a field of ``schema``; else one line naming ``PREFIXkey``, the valid keys and the
    closest (a dataclass object, typed already, has no other keys)."""
    if not isinstance(node, (Mapping, DictConfig)):
        return
    fields = [f.name for f in dataclasses.fields(schema)]
    for k in node.keys():
        if k not in fields:
            raise choice_error(f"{prefix}{k}", k, fields, what)
