"""``attribution`` (``hooks.types.attribution``): the metric differentiated and the clean batch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES
from hooks.specs.interventions import check_clean
from hooks.specs.tap import SlotEditSpec

METRICS = ("logit_diff", "logit")


@dataclass
class AttributionSpec(SlotEditSpec):
    clean: Any = None  #: the data keys making the clean batch (default ``{seed: 0}``)
    metric: str = "logit_diff"  #: the step metric differentiated (``metric.diff`` / ``metric.target``)

    def check(self, key: str) -> None:
        super().check(key)
        if self.index is not None:
            raise ConfigError(f"{key}.index: attribution estimates every index of dim 1 at once; drop index")
        if self.metric not in METRICS:
            raise choice_error(f"{key}.metric", self.metric, METRICS, "metric")
        check_clean(self.clean, f"{key}.clean")


HOOK_TYPES.declare("attribution", "hooks.types.attribution", AttributionSpec)
