"""``transcoder`` (``hooks.types.transcoder``): an ``sae`` entry's keys, read as a transcoder's: its folder and loader,
the modules whose input it reads and whose output it replaces, and the features' edit."""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES, check_finite
from hooks.specs.sae import SaeSpec

TRANSCODER_LOADER = "hooks.formats.transcoder_format.load_transcoder"


@dataclass
class TranscoderSpec(SaeSpec):
    """Keys of a ``transcoder`` entry (``hooks.types.transcoder`` says what each does); ``target`` stays ``output``."""

    _target_: str = TRANSCODER_LOADER  #: the function loading it from ``path`` (or one layer file of it)
    error: bool = True                 #: add the error term (false: the module's output is the transcoder's)
    default_loader = TRANSCODER_LOADER

    def check(self, key: str) -> None:
        check_finite(key, self)  # first: a NaN value is the mistake, whatever else is missing
        if not self.path:
            raise ConfigError(f"{key}.path: required: the transcoders' folder (SAELens: cfg.json and "
                              f"sae_weights.safetensors; circuit-tracer: layer_<i>.safetensors), e.g. "
                              f"{key}.path=transcoders")
        if self.target != "output":
            raise ConfigError(f"{key}.target: '{self.target}'; a transcoder reads the input of each module "
                              f"{key}.layers names and replaces its output: target is output")
        super().check(key)


HOOK_TYPES.declare("transcoder", "hooks.types.transcoder", TranscoderSpec)
