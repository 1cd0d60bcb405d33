"""``steer``: add ``scale`` times a steering vector to a module's output, at the positions ``index`` picks.

The vector has one value per unit of the output (the unit axis of ``hooks.types.units``: dim 1 of outputs
with 4 or more dims, the channels; the last dim otherwise, the features of a transformer block) and
comes from

* two stored runs (``positive``, ``negative``, read with ``common.rundir``): the float64 mean of the
  layer's kept outputs (every sample, position and step each run kept) in ``positive`` minus that in
  ``negative``, one vector per steered layer; or
* a file (``file``): a 1-D ``.npy`` array or a ``.pt`` tensor, the same vector for every layer.

A vector of another width than the layer's units is a one-line ``ConfigError`` in the plan's rehearsal.

With ``baseline: true`` (the default) the runner's loop runs each step's batch once more beside the
step, unsteered (``side_data``: the run's own data; one pass, ``side_clean`` is false), and the entry
writes ``steer.parquet`` (``common.records.STEER_SCHEMA``): per training step and sample, the model's
next-token distribution at the last position (a classifier's class distribution), steered and
unsteered, as ``top_k`` ids with their probabilities, and ``kl`` = KL(unsteered || steered). The
unsteered pass's metrics are the step row's ``corrupted_*`` columns.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from common.errors import ConfigError
from common.records import STEER
from common.rundir import check_run_dir, stored_tensors
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.mechanism.tap import Tap
from hooks.kernels.unit_stats import default_unit_axis
from hooks.specs.steer import SteerSpec


def mean_output(path: str, layers: list[str], slot: str, key: str) -> dict[str, torch.Tensor]:
    """Per layer, the float64 mean per unit of every ``slot`` output the run at ``path`` kept of it."""
    kept = stored_tensors(path, layers, "output", key)
    means = {}
    for layer in layers:
        rows = [t.double() for (_, name, _, s), t in sorted(kept.items()) if name == layer and s == slot]
        if not rows:
            raise ConfigError(f"{key}: run '{path}' kept no output slot {slot} of '{layer}'")
        axis = default_unit_axis(rows[0].dim())
        flat = torch.cat([t.movedim(axis, -1).reshape(-1, t.shape[axis]) for t in rows])
        means[layer] = flat.mean(0)
    return means


def vector_file(path: str, key: str) -> torch.Tensor:
    """The 1-D vector in a ``.npy`` or ``.pt`` file, as float64."""
    value = torch.from_numpy(np.load(path)) if path.endswith(".npy") else torch.load(path, weights_only=True)
    if not isinstance(value, torch.Tensor) or value.dim() != 1:
        what = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"{key}.file: '{path}' holds {what}; a steering vector is 1-D (one value per unit)")
    return value.double()


def next_token_log_probs(output: Any) -> torch.Tensor | None:
    """The model output's first tensor as log-probabilities over its last dim, at the last position of a
    ``[batch, positions, vocab]`` output; ``None`` for an output that is not logits."""
    logits = next((t for _, t in walk(output)), None)
    if logits is None or logits.dim() not in (2, 3) or not logits.is_floating_point():
        return None
    logits = logits.detach()[:, -1] if logits.dim() == 3 else logits.detach()
    return torch.log_softmax(logits.double(), dim=-1).cpu()


@register("steer")
class Steer(Tap):
    """Forward hook returning ``output + scale * vector`` (the vector along the unit axis), in ``index``'s part."""

    spec_class = SteerSpec
    writes = (STEER,)
    side_clean = False  # the unsteered pass is the step's own batch: no clean pass before it

    def __init__(self, name: str, spec: SteerSpec) -> None:
        super().__init__(name, spec)
        self._vectors: dict[tuple[str, str], torch.Tensor] = {}
        self._layer = ""
        self._mode = "steer"  # or, in the unsteered passes beside a step: "capture", "off"
        self._unsteered: torch.Tensor | None = None
        self._rows: dict[str, list] = {}

    @property
    def stored_runs(self) -> tuple[str, ...]:
        return (self.spec.positive, self.spec.negative) if self.spec.positive else ()

    def check_spec(self) -> None:
        for name, run in zip(("positive", "negative"), self.stored_runs):
            check_run_dir(run, f"{self.key}.{name}")

    @property
    def side_data(self) -> dict | None:
        return {} if self.spec.baseline else None

    @property
    def own_loop_problem(self) -> str | None:
        if not self.spec.baseline:
            return None
        return (f"{self.key}.baseline: the unsteered pass beside each step needs the runner's loop "
                f"(python -m runner); in your own loop set {self.key}.baseline=false")

    @contextlib.contextmanager
    def side_mode(self, mode: str) -> Iterator[None]:
        """Every pass beside a step is unsteered; the ``off`` pass is the baseline the step is compared to (a
        ``capture`` pass runs only for another entry's clean pass)."""
        before, self._mode = self._mode, mode
        try:
            yield
        finally:
            self._mode = before

    def attach(self, model: nn.Module, session) -> None:
        self._session = session
        if self.spec.file:
            self._file_vector = vector_file(self.spec.file, self.key)
        if self.spec.baseline:
            session.add(model.register_forward_hook(self._on_model_output))
        super().attach(model, session)

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        self._layer = layer

    def edit_output(self):
        return lambda out, args: self._steered(out)

    def vector(self, layer: str, slot: str) -> torch.Tensor:
        """The float64 steering vector of ``layer``'s output ``slot`` (from the file, or the runs' means)."""
        if (layer, slot) not in self._vectors:
            if self.spec.file:
                self._vectors[(layer, slot)] = self._file_vector
            else:
                plus = mean_output(self.spec.positive, [layer], slot, f"{self.key}.positive")[layer]
                minus = mean_output(self.spec.negative, [layer], slot, f"{self.key}.negative")[layer]
                if plus.shape != minus.shape:
                    raise ConfigError(f"{self.key}.negative: run '{self.spec.negative}' kept '{layer}' outputs of "
                                      f"{len(minus)} units, run '{self.spec.positive}' of {len(plus)}")
                self._vectors[(layer, slot)] = plus - minus
        return self._vectors[(layer, slot)]

    def _steered(self, out: torch.Tensor) -> torch.Tensor:
        vector = self.vector(self._layer, self.edited_slot)
        axis = default_unit_axis(out.dim())
        if out.dim() < 2 or out.shape[axis] != len(vector):
            source = f"file '{self.spec.file}'" if self.spec.file else f"runs' mean of '{self._layer}'"
            raise ConfigError(f"{self.key}.{'file' if self.spec.file else 'positive'}: the {source} is a vector of "
                              f"{len(vector)} units; '{self._layer}' outputs {list(out.shape)} (units: dim {axis})")
        if self._mode != "steer":
            return out
        shape = [1] * out.dim()
        shape[axis] = len(vector)
        return out + (self.spec.scale * vector).to(out.device, out.dtype).view(shape)

    def _on_model_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        """Keep the baseline pass's distribution; compare the step proper's with it (a row per sample)."""
        log_probs = next_token_log_probs(output)
        if log_probs is None:
            raise ConfigError(f"{self.key}.baseline: the model's output is no logits ([batch, classes] or [batch, "
                              f"positions, vocab]) to compare steered and unsteered; set {self.key}.baseline=false")
        if log_probs.is_meta or self._mode == "capture":
            return
        if self._mode == "off":
            self._unsteered = log_probs
            return
        unsteered, self._unsteered = self._unsteered, None
        if unsteered is None or unsteered.shape != log_probs.shape:
            return  # an eval pass: no unsteered pass ran beside it
        self._add_rows(log_probs, unsteered)

    def _add_rows(self, steered: torch.Tensor, unsteered: torch.Tensor) -> None:
        k = min(self.spec.top_k, steered.shape[-1])
        kl = (unsteered.exp() * (unsteered - steered)).sum(-1)
        tops = {side: torch.topk(lp, k, dim=-1) for side, lp in (("steered", steered), ("unsteered", unsteered))}
        layers = sorted({layer for layer, _ in self._vectors})
        rows = self._rows or {name: [] for name in ("method", "hook", "layers", "scale", "step", "sample", "kl",
                                                    "steered_top_ids", "steered_top_probs", "unsteered_top_ids",
                                                    "unsteered_top_probs")}
        n = len(kl)
        rows["method"] += ["steer"] * n
        rows["hook"] += [self.name] * n
        rows["layers"] += [layers] * n
        rows["scale"] += [self.spec.scale] * n
        rows["step"] += [self._session.step] * n
        rows["sample"] += range(n)
        rows["kl"] += kl.tolist()
        for side, top in tops.items():
            rows[f"{side}_top_ids"] += top.indices.tolist()
            rows[f"{side}_top_probs"] += top.values.exp().tolist()
        self._rows = rows

    def tables(self) -> dict[str, dict[str, list]]:
        return {STEER: self._rows} if self._rows else {}
