"""``logit_lens`` (``hooks.types.lens``): how many top tokens, and which token is the target."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES
from hooks.specs.samples import SampleOutputsSpec

NEXT, FINAL = "next", "final"


@dataclass
class LogitLensSpec(SampleOutputsSpec):
    top_k: int = 5  #: how many top tokens ``lens.parquet`` keeps per block and position
    target: Any = FINAL  #: ``final`` (the model's own top token), ``next`` (the input's next token) or a token id

    def check(self, key: str) -> None:
        if self.top_k < 1:
            raise ConfigError(f"{key}.top_k: {self.top_k} must be at least 1")
        if self.target not in (FINAL, NEXT) and (isinstance(self.target, bool) or not isinstance(self.target, int)
                                                 or self.target < 0):
            raise ConfigError(f"{key}.target: {self.target!r} is not '{FINAL}' (the model's own top token), "
                              f"'{NEXT}' (the input's next token) nor a token id")


HOOK_TYPES.declare("logit_lens", "hooks.types.lens", LogitLensSpec)
