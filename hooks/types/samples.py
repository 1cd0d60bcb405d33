"""The base of hook types that keep per-sample results of module outputs (``units``, ``store``).

``SampleOutputs`` registers one forward hook per selected module, takes the output tensor named
by ``slot`` and hands it, with the sample id of each row, to ``take(layer, x, samples)``. Every
pass over data that know their items (a training stream however shuffled, a whole-dataset pass,
``run.samples(ids)``) puts each batch's dataset indices on the recorder (``Recorder.samples``).
A source that cannot say (an infinite random stream: ``data=randn``) gives none: a sample is then
numbered by its place in the run (the samples of earlier steps first), and ``named`` turns False,
so that the tables say the ids are no index. On the meta device (the plan's rehearsal) only
``check(layer, x)`` runs: shapes, no data.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from hooks.kernels import tensor_kinds
from hooks.mechanism.base import HookType
from hooks.mechanism.recorder import walk
from hooks.specs.samples import SampleOutputsSpec


class SampleOutputs(HookType):
    """Forward hooks handing each selected module's output and its rows' sample ids to ``take``."""

    def __init__(self, name: str, spec: SampleOutputsSpec) -> None:
        super().__init__(name, spec)
        self.session = None
        self._targets: list[str] = []
        self._step = -1
        self._seen = 0    # samples counted in finished steps (no ids from the data)
        self._offset = 0
        #: whether every sample id handed to ``take`` was the data's own (False once one was a count)
        self.named = True
        #: the shape of each output seen on the meta device (the plan's rehearsal), by layer, in call order
        self.planned: dict[str, list[torch.Size]] = {}

    pytorch_hooks = "register_forward_hook (output)"

    def attach(self, model: nn.Module, session) -> None:
        self.session = session
        for name, module in self.targets(model):
            self._targets.append(name)
            session.add(module.register_forward_hook(self._hook(name)))

    def _hook(self, layer: str):
        def on_forward(module, args, output):
            self._observe(layer, output)
        return on_forward

    def _observe(self, layer: str, output: Any) -> None:
        tensors = dict(walk(output))
        if self.spec.slot not in tensors:
            raise ConfigError(f"{self.key}.slot: '{self.spec.slot}' is not a tensor of {layer}'s output; "
                              f"valid: {', '.join(tensors) or '(none)'}")
        x = tensor_kinds.per_sample(tensors[self.spec.slot], f"{self.key}: '{layer}' output {self.spec.slot}")
        self.check(layer, x)
        if x.is_meta:
            self.planned.setdefault(layer, []).append(x.shape)
        else:
            self.take(layer, x, self.sample_ids(layer, x.shape[0]))

    def check(self, layer: str, x: torch.Tensor) -> None:
        """Refuse an output this entry cannot take (also on the meta device, before the run)."""

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        raise NotImplementedError

    def sample_ids(self, layer: str, n: int) -> torch.Tensor:
        """The sample ids of the ``n`` rows of ``layer``'s output in this step."""
        given = self.session.recorder.samples
        if given is not None:
            if len(given) != n:
                raise ConfigError(f"{self.key}: {layer}'s output has {n} rows where the batch has {len(given)} "
                                  f"samples; it needs the batch as the output's first dim")
            return given
        self.named = False
        if self.session.step != self._step:
            self._step, self._offset = self.session.step, self._seen
        self._seen = max(self._seen, self._offset + n)
        return torch.arange(self._offset, self._offset + n)

    def report_unseen(self, seen: set[str]) -> None:
        """Say which matched modules were never called: they have no rows, and the user must know."""
        missing = [layer for layer in self._targets if layer not in seen]
        if missing:
            warnings.warn(f"{self.key} matched {', '.join(missing)} but they were never called: nothing "
                          f"recorded for them", UserWarning, stacklevel=3)

    def run_state(self) -> dict:
        return {"seen": self._seen, "named": self.named}

    def restore_run_state(self, state: dict) -> None:
        self._seen = state.get("seen", 0)
        self.named = state.get("named", True)
