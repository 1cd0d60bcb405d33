"""``attribution``: attribution patching, a first-order estimate of every patching cell from one backward.

Patching one layer's output at one index from the clean run changes the metric by about
``(clean - corrupted) · ∂metric/∂output`` summed over that index's part (a Taylor step from the
corrupted pass). The entry gets both terms beside each step, through the passes the runner's loop
runs for it (``runner.engine.side_by_side``): the clean pass keeps each selected layer's output
(``side_mode("capture")``); the corrupted pass (``side_mode("off")``, with gradients) keeps its own
and adds a zero leaf ``delta`` to it, so ``torch.autograd.grad(metric, deltas)`` is the gradient
with respect to the value the module produced, even where a later op changes it in place
(``ReLU(inplace=True)``). The estimate is summed over every dim but 1 (batch, and the unit axis:
a token model's width, a conv layer's height and width), one number per index of dim 1 (position
or channel, as ``index`` counts them). The step proper records it per layer and call as kind
``attribution`` (kept: ``tensors.parquet``), which ``runner.analysis.patching.patching_table`` reads
as rows of method ``attribution`` beside real patching's.
"""
from __future__ import annotations

import torch

from common.errors import ConfigError
from hooks.types.interventions import BesideStep, clean_data_keys
from hooks.mechanism.registry import register
from hooks.specs.attribution import AttributionSpec


def estimate(clean: torch.Tensor, corrupted: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``(clean - corrupted) * grad`` summed over every dim but 1, in float64: one estimate per index of dim 1."""
    product = (clean.double() - corrupted.double()) * grad.double()
    return product.sum(dim=[d for d in range(product.dim()) if d != 1])


@register("attribution")
class Attribution(BesideStep):
    """Forward hook keeping the clean and corrupted outputs beside each step; the step records the estimate."""

    spec_class = AttributionSpec

    def __init__(self, name: str, spec: AttributionSpec) -> None:
        super().__init__(name, spec)
        self._clean: dict[tuple[str, int, str], torch.Tensor] = {}
        self._corrupted: dict[tuple[str, int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self._estimates: dict[tuple[str, int, str], torch.Tensor] = {}

    @property
    def expected_kinds(self) -> set[str]:
        return super().expected_kinds | {"attribution"}

    @property
    def side_data(self) -> dict:
        return clean_data_keys(self.spec.clean)

    @property
    def side_metric(self) -> str:
        return self.spec.metric

    @property
    def own_loop_problem(self) -> str:
        return (f"{self.key}: attribution needs the runner's loop, which runs the clean and corrupted batches "
                f"beside each step (python -m runner)")

    eval_problem = "estimates patching each training step's batch, which held-out eval batches do not have"

    compile_problem = "differentiates the metric in a pass beside each step, which was not checked under compilation"

    def edit_output(self):
        return lambda out, args: self._seen(out)

    def start_capture(self) -> None:
        self._clean, self._estimates = {}, {}

    def _seen(self, out: torch.Tensor) -> torch.Tensor:
        key = (*self._at, self.edited_slot)
        if self._mode == "capture":
            self._clean[key] = out.detach().clone()
            return out
        if self._mode == "off":
            if not torch.is_grad_enabled():
                raise ConfigError(f"{self.key}: the corrupted pass beside the step ran without gradients")
            delta = torch.zeros_like(out, requires_grad=True)  # d metric / d delta = d metric / d out
            self._corrupted[key] = (out.detach().clone(), delta)
            return out + delta
        value = self._estimates.get(key)
        if value is None and out.device.type == "meta":
            return out  # the rehearsal: no pass runs beside it
        if value is None:
            raise ConfigError(f"{self.key}: the passes beside step {self._session.step} made no call {key[1]} of "
                              f"'{key[0]}' slot {key[2]} (the clean and corrupted batches take other paths)")
        self._recorder.record(value, hook=self.name, layer=key[0], phase="forward", kind="attribution",
                              slot=key[2], call=key[1], keep=True)
        return out

    def attach(self, model, session) -> None:
        self._session = session
        super().attach(model, session)

    def side_backward(self, value: torch.Tensor) -> None:
        """The estimate of every kept call, from the gradient of the corrupted pass's metric ``value``."""
        corrupted, self._corrupted = self._corrupted, {}
        keys = list(corrupted)
        grads = torch.autograd.grad(value, [corrupted[key][1] for key in keys], allow_unused=True)
        for key, grad in zip(keys, grads):
            kept, delta = corrupted[key]
            clean = self._clean.get(key)
            if clean is None or clean.shape != kept.shape:
                made = "no such call" if clean is None else f"shape {list(clean.shape)}"
                raise ConfigError(f"{self.key}: the clean pass made {made} of '{key[0]}' call {key[1]} slot {key[2]}; "
                                  f"the corrupted pass's is {list(kept.shape)}")
            self._estimates[key] = estimate(clean, kept, torch.zeros_like(delta) if grad is None else grad)
