"""Causal interventions on activations: ``ablate`` and ``patch``.

* ``ablate``: replaces a module's output (``target: input``: its first input) by zero, by a mean
  or by the value of another sample, in the part ``index`` selects (``hooks.index``). ``mean``
  and ``resample`` take their values from ``reference``: ``batch`` (the mean over the current
  batch; another sample of it, by a derangement drawn from ``seed`` at each call) or a stored
  run's directory (the mean over every sample it kept of that layer's output; a random stored
  sample per sample, drawn from ``seed``).
* ``patch``: replaces a module's output by the value the same module produced in a stored run
  (``source``), matched by layer, call, slot and step (``source_step``, default the same step),
  and records what it put in (kind ``patched``), so a patch that never happened is reported.
  ``source: clean`` takes the value from a clean pass of the same run instead: before each step
  the run loop feeds the clean batch (the run's data with ``clean``'s keys over it) while the
  entry keeps its layers' outputs (``side_mode("capture")``), then the corrupted batch unpatched
  (``side_mode("off")``), both outside the run's records (``runner.engine.side_by_side``).
  With a ``receiver`` (path patching) the senders (``layers``) keep their output and the receiver's
  first input gets ``clean - corrupted`` sender output added (at ``index``): what patching the
  senders would have sent that module, and no other reader. On a residual stream that is the direct
  path (block B's input is the residual), through none of the modules between them.

Both read a stored run with ``common.rundir`` when attached (each attach has fresh state: first in
the meta-device rehearsal, before the run): a run without the layer, or a stored shape that is
not the module's, is a one-line ``ConfigError`` naming the entry's key. On meta tensors (the
rehearsal) they draw nothing from ``seed``'s generator, so the real run draws what it would without one.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from common.errors import ConfigError
from common.rundir import StoredKey, check_run_dir, stored_steps, stored_tensors
from hooks.mechanism.families import known_vocabulary
from hooks.mechanism.registry import register
from hooks.mechanism.select import select_modules
from hooks.mechanism.tap import Tap
from hooks.specs.interventions import AblateSpec, CLEAN, PatchSpec


def overwritten(x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` holding ``value``: bit for bit ``value``, yet still in ``x``'s graph (with zero
    gradient), so a loss computed after a fully replaced layer can still run backward."""
    return x.clone().copy_(value)


def derangement(n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` without fixed points (one cycle through a random order)."""
    order = torch.randperm(n, generator=generator)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


@register("ablate")
class Ablate(Tap):
    """Forward hook (or pre-hook) replacing the selected part of a tensor by zero, a mean or another sample."""

    spec_class = AblateSpec

    def __init__(self, name: str, spec: AblateSpec) -> None:
        super().__init__(name, spec)
        self._pool: dict[tuple[str, str], torch.Tensor] | None = None  # a stored run's samples per layer and slot
        self._layer = ""

    @property
    def stored_runs(self) -> tuple[str, ...]:
        return () if self.spec.reference == "batch" else (self.spec.reference,)

    def check_spec(self) -> None:
        for run in self.stored_runs:
            check_run_dir(run, f"{self.key}.reference")

    def attach(self, model, session) -> None:
        self._generator = torch.Generator().manual_seed(self.spec.seed)
        if self.spec.reference != "batch" and self._pool is None:
            self._pool = self._stored_samples([layer for layer, _ in self.targets(model)])
        super().attach(model, session)

    def _stored_samples(self, layers: list[str]) -> dict[tuple[str, str], torch.Tensor]:
        """Every sample the reference run kept of each layer's output (``target: input``: its
        input), stacked along dim 0, by layer and slot: the slot edited is known at each call."""
        found = stored_tensors(self.spec.reference, layers, self.spec.target, f"{self.key}.reference")
        return {(layer, slot): torch.cat([t for key, t in sorted(found.items()) if key[1:4:2] == (layer, slot)])
                for layer, slot in {(key[1], key[3]) for key in found}}

    def on_pre(self, layer: str, call: int) -> None:
        self._layer = layer

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        self._layer = layer

    def edit_output(self):
        return (lambda out, args: self._ablated(out)) if self.spec.target == "output" else None

    def edit_input(self):
        return self._ablated if self.spec.target == "input" else None

    @property
    def edited_input(self) -> tuple[str, str]:
        return "slot", "0" if self.spec.slot is None else str(self.spec.slot)

    def _ablated(self, x: torch.Tensor) -> torch.Tensor:
        op = self.spec.op
        if op == "zero":
            return overwritten(x, torch.zeros((), dtype=x.dtype, device=x.device))
        if self._pool is not None:
            slot = self.edited_slot if self.spec.target == "output" else self.edited_input[1]
            pool = self._pool.get((self._layer, slot))
            if pool is None:
                raise ConfigError(f"{self.key}.reference: run '{self.spec.reference}' kept no {self.spec.target} "
                                  f"slot {slot} of '{self._layer}'")
            if pool.shape[1:] != x.shape[1:]:
                raise ConfigError(f"{self.key}.reference: run '{self.spec.reference}' kept '{self._layer}' "
                                  f"{self.spec.target}s of shape {list(pool.shape[1:])} per sample; this run's are "
                                  f"{list(x.shape[1:])}")
            pool = pool.to(x.device, x.dtype)
            if x.is_meta and op == "resample":
                return overwritten(x, x)
            if op == "mean":
                return overwritten(x, pool.mean(0, keepdim=True))
            picks = torch.randint(len(pool), (x.shape[0],), generator=self._generator)
            return overwritten(x, pool[picks.to(x.device)])
        if op == "mean":
            return x.mean(0, keepdim=True).expand_as(x)
        if x.shape[0] < 2:
            raise ConfigError(f"{self.key}.op: resample from the batch needs at least 2 samples, the batch has "
                              f"{x.shape[0]}; use a larger batch or reference=RUN_DIR")
        if x.is_meta:
            return x.clone()
        return x[derangement(x.shape[0], self._generator).to(x.device)]


class BesideStep(Tap):
    """A Tap acting in the clean and corrupted passes the runner's loop runs beside each step
    (``side_mode``: ``capture``, ``off``; ``step`` in the step proper), its output edit knowing
    the layer and call it is at (``_at``); ``start_capture`` forgets the last clean pass."""

    def __init__(self, name: str, spec) -> None:
        super().__init__(name, spec)
        self._at: tuple[str, int] = ("", 0)
        self._mode = "step"

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        self._at = (layer, call)

    def start_capture(self) -> None:
        """A clean pass begins: forget what the last one kept."""

    @contextlib.contextmanager
    def side_mode(self, mode: str) -> Iterator[None]:
        before, self._mode = self._mode, mode
        if mode == "capture":
            self.start_capture()
        try:
            yield
        finally:
            self._mode = before


def clean_data_keys(clean: dict | None) -> dict:
    """The data keys of the clean batch over the run's ``data``: ``clean``, default ``{seed: 0}``."""
    return dict(clean) if clean is not None else {"seed": 0}


@register("patch")
class Patch(BesideStep):
    """Forward hook returning the output the same module produced in the ``source`` run (or its indexed part)."""

    spec_class = PatchSpec

    def __init__(self, name: str, spec: PatchSpec) -> None:
        super().__init__(name, spec)
        self._source: dict[StoredKey, torch.Tensor] | None = None
        self._sent: dict[str, tuple[int, torch.Tensor]] = {}  # with a receiver: per sender, (step, clean - corrupted)

    @property
    def expected_kinds(self) -> set[str]:
        return super().expected_kinds | {"patched"}

    @property
    def side_by_side(self) -> bool:
        """Whether the values come from a clean pass of this run (``source: clean``)."""
        return self.spec.source == CLEAN

    @property
    def side_data(self) -> dict | None:
        """With ``source: clean``: the data keys of the clean batch, over the run's ``data``."""
        return clean_data_keys(self.spec.clean) if self.side_by_side else None

    @property
    def own_loop_problem(self) -> str | None:
        if not self.side_by_side:
            return None
        return (f"{self.key}.source: clean needs the runner's loop, which runs the clean batch beside each step "
                f"(python -m runner); in your own loop patch from a stored run: {self.key}.source=RUN_DIR")

    @property
    def stored_runs(self) -> tuple[str, ...]:
        return () if self.side_by_side else (self.spec.source,)

    def check_spec(self) -> None:
        for run in self.stored_runs:
            check_run_dir(run, f"{self.key}.source")

    def attach(self, model, session) -> None:
        if self._source is None and self.side_by_side:
            self._source = {}
        elif self._source is None:
            self._source = stored_tensors(self.spec.source, [layer for layer, _ in self.targets(model)],
                                          "output", f"{self.key}.source")
        self._session = session
        super().attach(model, session)
        if self.spec.receiver is not None:
            receiver = self.receiver_module(model)
            session.add(receiver[1].register_forward_pre_hook(self._receive(receiver[0]), with_kwargs=True))

    def receiver_module(self, model) -> tuple[str, torch.nn.Module]:
        """The one module ``receiver`` names, not one of the senders."""
        found = select_modules(model, self.spec.receiver, f"{self.key}.receiver")
        if len(found) != 1:
            names = ", ".join(name for name, _ in found[:4]) + ", ..." * (len(found) > 4)
            raise ConfigError(f"{self.key}.receiver: '{self.spec.receiver}' matches {len(found)} modules "
                              f"({names}); a path has one receiver")
        senders = {name for name, _ in self.targets(model)}
        if found[0][0] in senders:
            raise ConfigError(f"{self.key}.receiver: '{found[0][0]}' is also a sender (layers); a path runs from "
                              f"the senders to a later module")
        self._check_senders_join_the_residual(model, senders)
        return found[0]

    def _check_senders_join_the_residual(self, model, senders: set[str]) -> None:
        """A family that norms the attention's or the MLP's output before the residual (Gemma's
        ``ln_attn_out``, ``ln_mlp_out``) adds the norm's output to the stream, not the sender's: what the
        sender's change sends the receiver is the norm's, so such a sender is refused, naming the norm."""
        vocab = known_vocabulary(model)
        canonical = {} if vocab is None else {real: name for name, real in vocab.names.items()}
        for sender in sorted(senders):
            block, _, part = canonical.get(sender, "").rpartition(".")
            normed = f"{block}.ln_{'attn' if part == 'attn' else 'mlp'}_out"
            if part in ("attn", "mlp") and normed in vocab.names:
                raise ConfigError(f"{self.key}.layers: '{sender}' ({block}.{part}) reaches the residual stream through "
                                  f"{normed} ('{vocab.names[normed]}', a norm of the {vocab.family} family), so its "
                                  f"change is not what the receiver would be sent; send from {normed}")

    def _receive(self, receiver: str):
        """Forward pre-hook of the receiver: its first input plus what each sender's clean output adds to
        its corrupted one, in this step's pass (``_sent``)."""
        def on_pre(module, args, kwargs):
            if self._mode != "step":
                return None
            step = self._session.step
            sent = [delta for at, delta in self._sent.values() if at == step]
            if not args or not isinstance(args[0], torch.Tensor):
                raise ConfigError(f"{self.key}.receiver: '{receiver}' is called without a tensor as its first "
                                  f"positional input; a path adds to that input")
            if not sent and args[0].device.type == "meta":
                return None  # the rehearsal of a clean pass beside the step: nothing was sent
            if not sent:
                raise ConfigError(f"{self.key}.receiver: '{receiver}' ran before the senders "
                                  f"({self.spec.layers}) in step {step}; a path runs from them to a later module")
            delta = sum(sent)
            if delta.shape != args[0].shape:
                raise ConfigError(f"{self.key}.receiver: '{receiver}' takes an input of shape {list(args[0].shape)}, "
                                  f"the senders send {list(delta.shape)}; choose a receiver reading the residual")
            self._recorder.record(delta if self.index is None else delta[self.index.parts], hook=self.name,
                                  layer=receiver, phase="forward", kind="patched", slot="0",
                                  call=self._recorder.next_call((self.name, receiver)))
            return (args[0] + delta, *args[1:]), kwargs
        return on_pre

    # The values are the source's for the step's own batch: nothing fits a held-out batch.
    eval_problem = "patches in values recorded for each training step's batch, which held-out eval batches do not have"

    def check_steps(self, steps: int) -> None:
        """Every step of a run of ``steps`` steps has its source step in the source run (read from the
        stored run's step column: the spec's check, whether or not the model was rehearsed)."""
        if self.side_by_side:
            return
        have = stored_steps(self.spec.source, "output", f"{self.key}.source")
        wanted = [self.spec.source_step] if self.spec.source_step is not None else range(steps)
        lacking = [step for step in wanted if step not in have]
        if lacking:
            raise ConfigError(f"{self.key}.source_step: run '{self.spec.source}' has no step {lacking[0]} (it kept "
                              f"steps {have}); set {self.key}.source_step or run fewer steps")

    def edit_output(self):
        return lambda out, args: self._patched(out)

    def start_capture(self) -> None:
        """The clean pass's outputs become the values to patch in (``off``: the corrupted baseline,
        left as it is; ``step``: patched)."""
        self._source = {}

    def _patched(self, out: torch.Tensor) -> torch.Tensor:
        layer, call = self._at
        slot = self.edited_slot
        step = self.spec.source_step if self.spec.source_step is not None else self._session.step
        if self._mode == "capture":
            self._source[(step, layer, call, slot)] = out.detach().clone()
            return out
        if self._mode == "off":
            return out
        value = self._source.get((step, layer, call, slot))
        if value is None and self.side_by_side and out.device.type == "meta":
            return out  # the rehearsal: no clean pass runs there (the clean batch's shape is checked with the plan)
        if value is None and self.side_by_side:
            raise ConfigError(f"{self.key}.source: the clean pass made no call {call} of '{layer}' at step {step} "
                              f"(the clean and corrupted batches take different paths through the model)")
        if value is None:
            raise ConfigError(f"{self.key}.source: run '{self.spec.source}' kept no output slot {slot} of '{layer}' "
                              f"call {call} at step {step}")
        if value.shape != out.shape:
            where = "the clean pass made" if self.side_by_side else f"run '{self.spec.source}' kept"
            raise ConfigError(f"{self.key}.source: {where} '{layer}' outputs of shape "
                              f"{list(value.shape)}; this run's are {list(out.shape)}")
        value = value.to(out.device, out.dtype)
        if self.spec.receiver is not None:  # what this sender sends the receiver, there and only there
            delta = value - out.detach()
            self._sent[layer] = (self._session.step, delta if self.index is None else
                                 self.index.apply(torch.zeros_like(delta), delta))
            return out
        put = value if self.index is None else value[self.index.parts]
        self._recorder.record(put, hook=self.name, layer=layer, phase="forward", kind="patched", slot=slot, call=call)
        return overwritten(out, value)

