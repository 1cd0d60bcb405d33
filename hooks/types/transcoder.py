"""``transcoder``: a dictionary that reads one point and writes another, spliced with its error term, so that the
model computes what it computed without it until a feature is edited.

At each call of a selected module (an MLP: ``layers: blocks.*.mlp``) with input ``a`` and output ``y``, the
output is replaced by ``decode(f') + skip(a) + (y - decode(f) - skip(a))``, where ``f = encode(a)``, ``f'`` is
``f`` with the entry's edit applied and ``skip(a) = a @ W_skip.T`` is a skip transcoder's linear term (zero
otherwise). The error term is computed without gradient, so gradients reach ``a`` through the features and the
skip term only, as in circuit-tracer's replacement model; ``error: false`` leaves it out, so that the module's
output is the transcoder's own, ``decode(f') + skip(a)`` (how far the model then moves measures the transcoder).

It is an ``sae`` entry (``hooks.types.sae``) whose features read the module's input rather than the tensor they
replace: the same splice, the same keys (``features``, ``op``, ``value``, ``slot`` of a tuple output, a loader in
``_target_``), and the features are the output of a module added under each spliced one, named ``transcoder``
(``transformer.h.0.mlp.transcoder``; ``type:SaeFeatures`` selects every one), that ``stats``, ``units``,
``store``, ``extract``, ``ablate``, ``steer`` and ``patch`` select as they select an SAE's.

``path`` is a SAELens transcoder folder (the same transcoder at every selected module) or a circuit-tracer
folder of ``layer_<i>.safetensors`` (block ``i``'s at the MLP of block ``i``, found through the model's family
vocabulary, ``hooks.mechanism.families``); ``hooks.formats.transcoder_format`` reads both. Another format names its loader in
``_target_``, called with ``path``, returning one transcoder for every selected module.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.unit_sketch import default_unit_axis
from hooks.mechanism.families import vocabulary
from hooks.mechanism.registry import register
from hooks.types.sae import Sae
from hooks.formats.sae_format import host_bytes
from hooks.types.sae_width import input_width, output_width
from hooks.specs.transcoder import TRANSCODER_LOADER, TranscoderSpec
from hooks.mechanism.tap import Tap
from hooks.formats.transcoder_format import check_folder, check_transcoder

#: The name of the features module under each spliced module.
FEATURES = "transcoder"
BLOCK_MLP = re.compile(r"blocks\.(\d+)\.mlp")


@register("transcoder")
class Transcoder(Sae):
    """Splices a transcoder with its error term at each selected module (see the module docstring)."""

    spec_class = TranscoderSpec
    features_name = FEATURES
    what = "transcoder"

    def __init__(self, name: str, spec: TranscoderSpec, folder: dict | None = None) -> None:
        super().__init__(name, spec, folder)
        #: What ``check_folder`` read of the folder (its format, configs, per-block files and dims), once per
        #: entry; ``None`` for another format's loader.
        self.folder = folder if folder is not None or spec._target_ != TRANSCODER_LOADER else check_folder(
            spec.path, f"{self.key}.path")
        self._by_layer: dict[str, tuple[Any, tuple[int, int], int]] = {}  # layer -> (transcoder, (d_out, d_sae), d_in)
        self._d_in = 0

    @property
    def keeps_error(self) -> bool:
        return self.spec.error

    def edit_output(self):
        return lambda out, args: self._spliced(out, self._read(args))

    def _read(self, args: tuple) -> torch.Tensor:
        """The module's input, which the features read."""
        if not args or not isinstance(args[0], torch.Tensor):
            raise ConfigError(f"{self.key}: '{self._layer}' was called without a tensor as its first positional "
                              f"argument; a transcoder reads the input of the module it splices")
        return args[0]

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        super().on_forward(layer, call, args, output)
        self._sae, self._dims, self._d_in = self._by_layer[layer]

    def _source(self, model: nn.Module, layer: str) -> tuple[str, tuple[int, int, int] | None]:
        """The path the loader reads for ``layer`` and its ``(d_in, d_sae, d_out)`` when the folder tells them."""
        if self.folder is None:
            return self.spec.path, None
        if self.folder["format"] == "saelens":
            return self.spec.path, self.folder["dims"]
        block = self._block(model, layer)
        if block not in self.folder["layers"]:
            held = sorted(self.folder["layers"])
            raise ConfigError(f"{self.key}.path: '{self.spec.path}' has no layer_{block}.safetensors for '{layer}' "
                              f"(blocks.{block}.mlp); it holds the transcoders of blocks {', '.join(map(str, held))}")
        return str(self.folder["layers"][block]), self.folder["dims"][block]

    def _block(self, model: nn.Module, layer: str) -> int:
        """The block whose MLP ``layer`` is, by the model's family vocabulary."""
        for canonical, real in vocabulary(model, f"{self.key}.layers").names.items():
            found = BLOCK_MLP.fullmatch(canonical)
            if real == layer and found:
                return int(found.group(1))
        raise ConfigError(f"{self.key}.layers: '{layer}' is not a block's MLP; a circuit-tracer folder holds one "
                          f"transcoder per block, spliced at blocks.<i>.mlp ({self.key}.layers=blocks.*.mlp)")

    def check_built(self, model: nn.Module) -> None:
        """Each transcoder's ``d_in`` and ``d_out`` against the width of the input and output of the module it
        would splice (``hooks.types.sae_width``), where the model built on the meta device tells them, and the feature
        numbers against ``d_sae``."""
        for layer, module in Tap.targets(self, model):  # the model's modules, given no features module
            path, dims = self._source(model, layer)
            if dims is None:
                continue
            d_in, d_sae, d_out = dims
            if self.spec.features is not None and not isinstance(self.spec.features, str):
                self.features_index.check(torch.Size([1, d_sae]))
            for point, dim, width in (("input", d_in, input_width(module)),
                                      ("output", d_out, output_width(module, self.spec.slot))):
                if width is not None and width != dim:
                    self._refuse(layer, point, f"d_{'in' if point == 'input' else 'out'}={dim}",
                                 f"[..., {width}]", width)

    def _refuse(self, layer: str, point: str, dim: str, shape: str, width: Any) -> None:
        verb = "reads" if point == "input" else "writes"
        raise ConfigError(f"{self.key}.path: the transcoder at '{self.spec.path}' {verb} vectors of {dim}; "
                          f"'{layer}' {point} is {shape}, {width} units wide")

    def _load_dictionaries(self, model: nn.Module) -> None:
        """One transcoder per selected module (a file read once however many modules share it)."""
        loaded: dict[str, tuple[Any, tuple[int, int], int]] = {}
        self._by_layer = {}
        for layer, _ in Tap.targets(self, model):
            path, _ = self._source(model, layer)
            if path not in loaded:
                tc = self._load(path, self.folder)
                d_in, d_sae, d_out = check_transcoder(tc, f"{self.key}._target_")
                loaded[path] = (tc, (d_out, d_sae), d_in)
            self._by_layer[layer] = loaded[path]
        self._sae, self._dims, self._d_in = next(iter(self._by_layer.values()))

    def dictionaries(self) -> dict[str, Any]:
        """The transcoder spliced at each selected module, once attached (``hooks.types.graph`` reads their weights)."""
        return {layer: tc for layer, (tc, _, _) in self._by_layer.items()}

    def held_bytes(self) -> dict[str, int]:
        """The transcoders' weights, loaded on the host for the run (``memory.budget`` counts them)."""
        held = {id(tc): host_bytes(tc) for tc, _, _ in self._by_layer.values()}
        return {"transcoder weights": sum(held.values())} if held else {}

    def _check_widths(self, layer: str, x: torch.Tensor, read: torch.Tensor) -> None:
        """One line when the input is not ``d_in`` or the output not ``d_out`` wide along its unit axis, or
        their ranks differ (the features read each position of the input and write the same position)."""
        for point, t, dim in (("input", read, self._d_in), ("output", x, self._dims[0])):
            axis = default_unit_axis(t.dim())
            if t.dim() < 2 or t.shape[axis] != dim or t.dim() != x.dim():
                self._refuse(layer, point, f"d_{'in' if point == 'input' else 'out'}={dim}",
                             f"{list(t.shape)} (units: dim {axis})", t.shape[axis] if t.dim() else "-")

    def _reconstruction(self, features: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
        """``decode(features) + read @ W_skip.T`` (the skip term when the transcoder has one)."""
        out = self._sae.decode(features)
        skip = getattr(self._sae, "W_skip", None)
        if skip is not None:
            out = out + read.to(skip.dtype) @ skip.to(read.device).T
        return out
