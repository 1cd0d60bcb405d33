"""``steer`` (``hooks.types.steer``): where the steering vector comes from. Its run directories are checked
by the hook (``check_spec``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import SlotEditSpec

VECTOR_FILES = (".npy", ".pt")


@dataclass
class SteerSpec(SlotEditSpec):
    scale: float = 1.0  #: what the vector is multiplied by before it is added
    positive: str = ""  #: a run directory: its mean output is added ...
    negative: str = ""  #: ... minus this run's
    file: str = ""      #: or a 1-D vector in a .npy or .pt file
    baseline: bool = True  #: an unsteered pass beside each step: steer.parquet's KL and top-k
    top_k: int = 5  #: how many top next tokens ``steer.parquet`` keeps, steered and unsteered

    def check(self, key: str) -> None:
        super().check(key)
        runs = bool(self.positive) or bool(self.negative)
        if runs == bool(self.file):
            raise ConfigError(f"{key}: give the vector as {key}.positive=RUN_DIR {key}.negative=RUN_DIR (the mean "
                              f"output difference) or as {key}.file=PATH.npy|.pt, not {'both' if runs else 'neither'}")
        if runs:
            for name in ("positive", "negative"):
                if not getattr(self, name):
                    raise ConfigError(f"{key}.{name}: required with the other run; a run directory that kept "
                                      f"these layers' outputs (hooks=extract)")
        elif Path(self.file).suffix not in VECTOR_FILES:
            raise ConfigError(f"{key}.file: '{self.file}' is not a {' or '.join(VECTOR_FILES)} file")
        elif not Path(self.file).is_file():
            raise ConfigError(f"{key}.file: no file at '{self.file}'")
        if self.top_k < 1:
            raise ConfigError(f"{key}.top_k: {self.top_k} must be at least 1")


HOOK_TYPES.declare("steer", "hooks.types.steer", SteerSpec)
