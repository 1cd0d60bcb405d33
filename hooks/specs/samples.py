"""Keys of the types reading one tensor of each output per sample (``hooks.types.samples``)."""
from __future__ import annotations

from dataclasses import dataclass

from hooks.specs.base import HookSpec


@dataclass
class SampleOutputsSpec(HookSpec):
    slot: str = "0"  #: which tensor of a tuple or mapping output (``hooks.mechanism.recorder.walk``)
