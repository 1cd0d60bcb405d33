"""``sae`` (``hooks.types.sae``): the SAE's folder and loader, where it is spliced, and the features' edit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES, check_finite
from hooks.specs.callables import resolve_callable
from hooks.specs.index import Index, parse_index
from hooks.specs.tap import TapSpec

SAELENS_LOADER = "hooks.formats.sae_format.load_saelens"
TARGETS = ("output", "input")
#: The edits of the features: ``hooks.types.sae.EDIT_OPS`` says what each does.
OPS = ("ablate", "clamp", "steer")


def feature_index(value: Any, key: str) -> Index | None:
    """The features ``value`` picks: a list of feature numbers along the last dim, or an ``index`` string."""
    index = parse_index(value, key)
    if index is None or isinstance(value, str):
        return index
    return Index((Ellipsis, index.parts[1]), index.text, key)


@dataclass
class SaeSpec(TapSpec):
    """Keys of an ``sae`` entry (``hooks.types.sae`` says what each does)."""

    path: str = ""                    #: the SAE's folder
    _target_: str = SAELENS_LOADER    #: the function loading it from ``path``
    target: str = "output"            #: splice at the modules' output or input
    slot: Any = None                  #: which tensor of a tuple output (or which input: position or keyword)
    features: Any = None              #: the features the edit changes
    op: Optional[str] = None          #: ablate | clamp | steer (null: splice only)
    value: float = 0.0                #: clamp's value, steer's addend

    def check(self, key: str) -> None:
        super().check(key)
        check_finite(key, self)  # first: a NaN value is the mistake, whatever else is missing
        if self.scope != "module":
            raise ConfigError(f"{key}.scope: an SAE is spliced at the modules {key}.layers names; use scope=module")
        if self.target not in TARGETS:
            raise choice_error(f"{key}.target", self.target, TARGETS, "target")
        if not self.path:
            raise ConfigError(f"{key}.path: required: the SAE's folder (SAELens: cfg.json and "
                              f"sae_weights.safetensors), e.g. {key}.path=saes/blocks.0")
        if self._target_ != SAELENS_LOADER:  # a SAELens folder is checked once, by the entry (``Sae.folder``)
            resolve_callable(self._target_, f"{key}._target_", 1, "(path)")
        if self.op is not None and self.op not in OPS:
            raise choice_error(f"{key}.op", self.op, OPS, "op")
        if (self.op is None) != (self.features is None):
            given, lacking = ("op", "features") if self.features is None else ("features", "op")
            raise ConfigError(f"{key}.{lacking}: required with {key}.{given}: an edit names the features "
                              f"({key}.features=[3,17]) and what it does ({key}.op={'|'.join(OPS)})")
        feature_index(self.features, f"{key}.features")


HOOK_TYPES.declare("sae", "hooks.types.sae", SaeSpec)
