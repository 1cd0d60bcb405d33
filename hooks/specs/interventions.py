"""``ablate`` and ``patch`` (``hooks.types.interventions``). A stored run they read is checked by the hook
(``check_spec``: reading it needs the run's files), the rest here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from common.errors import ConfigError, choice_error
from hooks.specs.base import HOOK_TYPES
from hooks.specs.tap import SlotEditSpec

ABLATE_OPS = ("zero", "mean", "resample")
ABLATE_TARGETS = ("output", "input")
#: ``source`` value of a patch taken from a clean pass of the same run.
CLEAN = "clean"


@dataclass
class AblateSpec(SlotEditSpec):
    op: str = "zero"  #: ``zero``, ``mean`` or ``resample`` (another sample's value)
    target: str = "output"  #: ``output``, or ``input`` (the first input, or the one ``slot`` names)
    reference: str = "batch"  #: where ``mean`` and ``resample`` take values: ``batch`` or a stored run's directory
    seed: int = 0  #: seeds ``resample``'s choice of samples

    def check(self, key: str) -> None:
        super().check(key)
        if self.op not in ABLATE_OPS:
            raise choice_error(f"{key}.op", self.op, ABLATE_OPS, "op")
        if self.target not in ABLATE_TARGETS:
            raise choice_error(f"{key}.target", self.target, ABLATE_TARGETS, "target")
        if self.reference != "batch" and self.op == "zero":
            raise ConfigError(f"{key}.reference: op=zero takes no reference; drop it or use op=mean|resample")


def check_clean(clean: Any, key: str) -> None:
    """``clean`` (the data keys of a clean pass beside each step) is a mapping, or ``None``."""
    if clean is not None and not isinstance(clean, dict):
        raise ConfigError(f"{key}: {clean!r} must be a mapping of data keys, e.g. {{seed: 0}}")


@dataclass
class PatchSpec(SlotEditSpec):
    source: str = ""  #: a stored run's directory, or ``clean`` (a clean pass of the same run beside each step)
    source_step: Optional[int] = None  #: the stored run's step to take values from (null: the same step)
    clean: Any = None  #: with ``source: clean``: data keys making the clean batch (default ``{seed: 0}``)
    receiver: Optional[str] = None  #: a later module: patch only what ``layers`` send it (path patching)

    def check(self, key: str) -> None:
        super().check(key)
        if self.receiver is not None and self.scope == "global":
            raise ConfigError(f"{key}.receiver: a path runs from the modules layers names; use scope=module")
        if not self.source:
            raise ConfigError(f"{key}.source: required: the directory of a complete run that kept these "
                              f"layers' outputs (hooks=extract or capture), e.g. {key}.source=runs/clean, "
                              f"or clean (a clean pass of this run on {key}.clean's data)")
        if self.source == CLEAN:
            if self.source_step is not None:
                raise ConfigError(f"{key}.source_step: a clean pass runs before every step of this run; "
                                  f"source_step is for a stored source run")
            check_clean(self.clean, f"{key}.clean")
            return
        if self.clean is not None:
            raise ConfigError(f"{key}.clean: only meaningful with {key}.source=clean (the source is the run "
                              f"'{self.source}')")
        if self.source_step is not None and self.source_step < 0:
            raise ConfigError(f"{key}.source_step: {self.source_step} is not a step (steps count from 0)")


HOOK_TYPES.declare("ablate", "hooks.types.interventions", AblateSpec)
HOOK_TYPES.declare("patch", "hooks.types.interventions", PatchSpec)
