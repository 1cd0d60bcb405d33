"""``units`` (``hooks.types.units``): the per-unit statistics' axis, sketch and top samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES
from hooks.specs.samples import SampleOutputsSpec


class FLOAT32:
    """float32's smallest normal and largest finite magnitudes (``torch.finfo(torch.float32)``'s
    ``tiny`` and ``max``), the range the sketch buckets."""

    tiny = 2.0 ** -126
    max = (2 - 2.0 ** -23) * 2.0 ** 127


@dataclass
class UnitsSpec(SampleOutputsSpec):
    """Keys of a ``units`` entry (``hooks.types.units`` says what it computes)."""

    unit_axis: Optional[int] = None       #: null: 1 for outputs of 4+ dims, the last dim otherwise
    threshold: float = 0.0                #: ``above`` counts values > threshold (dead fraction: 1 - above/count)
    top_k: int = 16                       #: top and bottom samples kept per unit
    relative_error: float = 0.01          #: of the quantile sketch, for magnitudes in [sketch_low, sketch_high]
    sketch_low: float = 1e-6              #: magnitudes below count as 0 (absolute error < sketch_low)
    sketch_high: float = 1e6              #: magnitudes above share the last bucket
    second_moment: bool = False           #: the sum of x x^T over the layer's units (covariance, PCA)
    examples: int = 4                     #: first top samples per unit (at most top_k) whose map and input are kept

    def check(self, key: str) -> None:
        if self.top_k < 0:
            raise ConfigError(f"{key}.top_k: {self.top_k} must be >= 0")
        if self.examples < 0:
            raise ConfigError(f"{key}.examples: {self.examples} must be >= 0 (0: no pictures of top examples), e.g. 4")
        if not 1e-6 <= self.relative_error < 1:
            raise ConfigError(f"{key}.relative_error: {self.relative_error} must be in [1e-6, 1), e.g. 0.01")
        if not FLOAT32.tiny <= self.sketch_low <= FLOAT32.max:
            raise ConfigError(f"{key}.sketch_low: {self.sketch_low} must be in [{FLOAT32.tiny:g}, {FLOAT32.max:g}] "
                              f"(the sketch buckets float32 magnitudes), e.g. 1e-6")
        if not self.sketch_low < self.sketch_high <= FLOAT32.max:
            raise ConfigError(f"{key}.sketch_high: {self.sketch_high} must be above sketch_low={self.sketch_low} "
                              f"and at most {FLOAT32.max:g} (the sketch buckets float32 magnitudes), e.g. 1e6")


HOOK_TYPES.declare("units", "hooks.types.units", UnitsSpec)
