"""``sae``: a sparse autoencoder spliced into the forward pass at a module's output (or input), with
its reconstruction error, so that the model computes what it computed without it until a feature
is edited.

At each call of a selected module the hooked tensor ``x`` is replaced by ``decode(f') + (x - decode(f))``,
where ``f = encode(x)`` and ``f'`` is ``f`` with the entry's edit applied; the error term ``x - decode(f)``
is computed without gradient, as SAELens's ``use_error_term`` does, so gradients reach ``x`` through the
features. The SAE reads ``x`` along its unit axis (that of ``hooks.types.units``: the last dim, ``d_in`` wide, of a
transformer's ``[batch, positions, d_in]``; dim 1, the channels, of a conv map): one vector per position.

The features are the output of a module: the entry adds an ``SaeFeatures`` child named ``sae`` to
each module it splices (``transformer.h.0.sae``) for as long as it is attached, and calls it on
``x``. A container (``nn.Sequential``, ``nn.ModuleList``) would call that child itself: the entry is
refused there, naming the module inside it to splice at instead. Every hook type selects it by that name and sees ``f`` there: ``stats``, ``units`` (a feature is a
unit: its statistics and top examples over a dataset pass; ``f`` has ``d_sae`` units on the axis ``x`` had ``d_in``), ``store``, ``extract``, and the edits
(``ablate``, ``steer``, ``patch``), whose result is then decoded. List the ``sae`` entry before the
entries that select its features (``hooks=[sae,units]``): it adds the module they name.

The entry's own edit, on the features ``features`` picks (``[3, 17]``: those features at every
position; a string such as ``'..., 0:4'`` or ``':, 5, 3'`` as for ``index``, ``hooks.index``, indexing
``[batch, positions..., d_sae]``), after
the recording entries saw them: ``op: ablate`` sets them to 0, ``clamp`` to ``value``, ``steer`` adds ``value``.

The SAE is read from ``path``: a SAELens folder by default (``hooks.formats.sae_format``); another format
names its loader in ``_target_``, a function called with ``path`` that returns an SAE with ``encode``,
``decode`` and ``W_dec`` ``[d_sae, d_in]``. Several entries splice several SAEs (one per entry,
at every module its ``layers`` selects).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from functools import partial
from typing import Any, Callable

import torch
from omegaconf import ListConfig
from torch import nn

from common.errors import ConfigError
from common.unit_sketch import default_unit_axis
from hooks.mechanism.base import HookType
from hooks.specs.callables import resolve_callable
from hooks.types.edits import OPS as EDITS
from hooks.specs.index import Index, narrowed
from hooks.mechanism.registry import register
from hooks.formats.sae_format import check_sae, check_saelens, host_bytes
from hooks.types.sae_width import input_width, output_width
from hooks.mechanism.tap import Tap
from hooks.specs.sae import SAELENS_LOADER, SaeSpec, feature_index

#: The name of the features module under each spliced module.
FEATURES = "sae"
#: Modules whose forward (or their owner's loop) calls every child: a features module added there would run.
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
#: Each op as ``hooks.types.edits``' op and its value (``None``: the entry's ``value``).
EDIT_OPS = {"ablate": (EDITS["set"], 0.0), "clamp": (EDITS["set"], None), "steer": (EDITS["add"], None)}


class SaeFeatures(nn.Module):
    """The feature activations of the SAE spliced at its parent module: ``forward(x)`` gives ``encode``
    of ``x`` along its unit axis, ``d_sae`` units there. A module, so that any entry selects it by name and
    sees its output."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner  #: the key of the entry that splices it
        self.encode: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.encode is None:
            raise ConfigError(f"{self.owner}: its features module was called while the entry is not attached")
        return self.encode(x)


@register("sae")
class Sae(Tap):
    """Splices an SAE with its error term at each selected module (see the module docstring)."""

    spec_class = SaeSpec
    #: The name of the features module it adds under each spliced module (``hooks.types.transcoder``: ``transcoder``).
    features_name = FEATURES
    #: What it splices, for messages.
    what = "SAE"
    #: Add the error term (``hooks.types.transcoder``'s ``error: false`` leaves the dictionary's output alone).
    keeps_error = True

    def __init__(self, name: str, spec: SaeSpec, folder: dict | None = None) -> None:
        super().__init__(name, spec)
        #: A SAELens folder's ``cfg.json`` as ``check_saelens`` read and checked it, once per entry (``fresh`` keeps
        #: it); ``None`` for another format's loader.
        self.folder = folder if folder is not None or spec._target_ != SAELENS_LOADER else check_saelens(
            spec.path, f"{self.key}.path")
        self._sae: Any = None
        self._dims = (0, 0)  # (d_in, d_sae)
        self._features: dict[str, tuple[nn.Module, SaeFeatures]] = {}  # layer -> (the spliced module, its child)
        self._layer = ""
        self._clean: torch.Tensor | None = None  # encode(x) of the call being spliced

    def fresh(self) -> Sae:
        return type(self)(self.name, self.spec, self.folder)

    @functools.cached_property
    def features_index(self) -> Index | None:
        return feature_index(self.spec.features, f"{self.key}.features")

    compile_problem = "calls its features module inside a forward hook, which was not checked under compilation"

    @property
    def edited_input(self) -> tuple[str, str]:
        return "slot", "0" if self.spec.slot is None else str(self.spec.slot)

    def edit_output(self):
        return (lambda out, args: self._spliced(out)) if self.spec.target == "output" else None

    def edit_input(self):
        return self._spliced if self.spec.target == "input" else None

    def on_pre(self, layer: str, call: int) -> None:
        self._layer = layer

    def on_forward(self, layer: str, call: int, args: tuple, output: Any) -> None:
        self._layer = layer

    @classmethod
    def check_with(cls, hooks: list[HookType]) -> None:
        check_order(hooks)

    def check_built(self, model: nn.Module) -> None:
        """A SAELens SAE's ``d_in`` against the width of each tensor it would splice (``hooks.types.sae_width``),
        where the model built on the meta device tells it, and the feature numbers against ``d_sae``."""
        cfg = self.folder
        if cfg is None:
            return
        d_in = cfg["d_in"]
        if isinstance(self.spec.features, (int, list, ListConfig)):  # feature numbers: they fit d_sae or not
            self.features_index.check(torch.Size([1, cfg["d_sae"]]))
        for layer, module in super().targets(model):  # the model's modules, given no features module
            probe = input_width if self.spec.target == "input" else partial(output_width, slot=self.spec.slot)
            width = probe(module)
            if width is not None and width != d_in:
                self._refuse_width(layer, d_in, f"[..., {width}]", width)

    def _refuse_width(self, layer: str, d_in: int, shape: str, width: Any) -> None:
        where = self.spec.target + ("" if self.spec.slot is None else f" slot {self.spec.slot}")
        raise ConfigError(f"{self.key}.path: the SAE at '{self.spec.path}' reads vectors of d_in={d_in}; "
                          f"'{layer}' {where} is {shape}, {width} units wide")

    def targets_and_points(self, model: nn.Module) -> tuple[list[tuple[str, nn.Module]], dict[str, set[str]]]:
        """The modules ``layers`` selects, each given its features module (``<layer>.sae``), which
        entries listed after this one can then select (``targets`` and ``attach`` both ask this)."""
        selected, points = super().targets_and_points(model)
        found = [(layer, module) for layer, module in selected
                 if not (isinstance(module, SaeFeatures) and module.owner == self.key)]  # added by itself
        for layer, module in found:
            if isinstance(module, SaeFeatures):
                raise ConfigError(f"{self.key}.layers: '{layer}' is the features module of {module.owner}; "
                                  f"an SAE is spliced at a module of the model")
            self._features[layer] = (module, self._features_module(layer, module))
        return found, points

    def _features_module(self, layer: str, module: nn.Module) -> SaeFeatures:
        if isinstance(module, CONTAINERS):
            children = [name for name, _ in module.named_children()]
            inner = f"{layer}.{children[-1 if self.spec.target == 'output' else 0]}" if children else "a module"
            raise ConfigError(f"{self.key}.layers: '{layer}' is a container ({type(module).__name__}), which would call "
                              f"the features module added to it; splice at the module its {self.spec.target} "
                              f"is, '{inner}'")
        child = dict(module.named_children()).get(self.features_name)
        if isinstance(child, SaeFeatures) and child.owner == self.key:
            return child
        if child is not None or hasattr(module, self.features_name):
            owner = child.owner if isinstance(child, SaeFeatures) else f"the model's {type(child or module).__name__}"
            raise ConfigError(f"{self.key}.layers: '{layer}' has an {self.what} already (spliced by {owner}); "
                              f"one {self.what} per module: splice the next one at another module")
        child = SaeFeatures(self.key)
        module.add_module(self.features_name, child)
        return child

    def attach(self, model: nn.Module, session) -> None:
        self._load_dictionaries(model)
        super().attach(model, session)  # its targets() adds the features modules
        for _, child in self._features.values():
            child.encode = self._encode

    def _load_dictionaries(self, model: nn.Module) -> None:
        """The SAE, one for every module the entry splices (``hooks.types.transcoder`` loads one per block)."""
        self._sae = self._load(self.spec.path, self.folder)
        self._dims = check_sae(self._sae, f"{self.key}._target_")

    def held_bytes(self) -> dict[str, int]:
        """The SAE's weights, loaded on the host for the run (``memory.budget`` counts them)."""
        return {"SAE weights": host_bytes(self._sae)} if self._sae is not None else {}

    def _load(self, path: str, cfg: dict | None) -> Any:
        """What the entry's loader (``_target_``) returns for ``path``; ``cfg``: what the entry read of the folder,
        given to the default loader."""
        target = self.spec._target_
        loader = resolve_callable(target, f"{self.key}._target_", 1, "(path)")
        if cfg is not None:  # the default loader, given the config the entry read
            loader = partial(loader, cfg=cfg)
        try:
            return loader(path)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's loader failed: one line naming it
            raise ConfigError(f"{self.key}._target_: '{target}' raised {type(exc).__name__} "
                              f"loading '{path}': {exc}") from None

    def close(self) -> None:
        """Take the features modules out of the model again."""
        for module, child in self._features.values():
            if dict(module.named_children()).get(self.features_name) is child:
                delattr(module, self.features_name)
            child.encode = None
        self._features = {}

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """The features of ``x`` along its unit axis (kept for the error term as ``[..., d_sae]``), shapes
        only on the meta device."""
        axis = default_unit_axis(x.dim())
        x = x.movedim(axis, -1)
        if x.is_meta:
            self._clean = x.new_empty((*x.shape[:-1], self._dims[1]))
        else:
            if isinstance(self._sae, nn.Module) and self._sae.W_dec.device != x.device:
                self._sae.to(x.device)
            self._clean = self._sae.encode(x)
        return self._clean.movedim(-1, axis)

    def _spliced(self, x: torch.Tensor, read: torch.Tensor | None = None) -> torch.Tensor:
        """``decode(f') + (x - decode(f))`` along the unit axis: see the module docstring. ``read``: the tensor
        the features read when it is not ``x`` (a transcoder's: the module's input)."""
        layer, axis = self._layer, default_unit_axis(x.dim())
        read = x if read is None else read
        self._check_widths(layer, x, read)
        features = self._features[layer][1](read)
        clean, self._clean = self._clean, None
        edited = self._edited(features.movedim(axis, -1))
        if x.is_meta:
            return x
        x, read = x.movedim(axis, -1), read.movedim(axis, -1)
        out = self._reconstruction(edited, read)
        if self.keeps_error:
            with torch.no_grad():  # the error term carries no gradient
                error = x - self._reconstruction(clean, read)
            out = out + error
        return out.to(x.dtype).movedim(-1, axis)

    def _check_widths(self, layer: str, x: torch.Tensor, read: torch.Tensor) -> None:
        """One line when ``x`` is not ``d_in`` wide along its unit axis."""
        axis = default_unit_axis(x.dim())
        if x.dim() < 2 or x.shape[axis] != self._dims[0]:
            width = x.shape[axis] if x.dim() >= 2 else "-"
            self._refuse_width(layer, self._dims[0], f"{list(x.shape)} (units: dim {axis})", width)

    def _reconstruction(self, features: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
        """What the dictionary makes of ``features`` (``[..., d_sae]``) read from ``read``: an SAE's ``decode``."""
        return self._sae.decode(features)

    def _edited(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` with the entry's op applied to the part ``features`` picks (``hooks.index.narrowed``)."""
        if self.features_index is None:
            return features
        op, value = EDIT_OPS[self.spec.op]
        return narrowed(lambda x: op(x, self.spec.value if value is None else value), self.features_index)(features)


def check_order(hooks: Sequence[HookType]) -> None:
    """Refuse an entry selecting an SAE's features (``<layer>.sae``, ``type:SaeFeatures``) that is listed
    before every ``sae`` entry, or attached at an earlier step than the first listed before it: the
    features module it names exists only once an ``sae`` entry is attached."""
    splicers = [hook for hook in hooks if isinstance(hook, Sae)]
    for position, hook in enumerate(hooks):
        selectors = [hook.spec.layers] if isinstance(hook.spec.layers, str) else list(hook.spec.layers or [])
        named = [s for s in selectors if isinstance(s, str) and (
            {sae.features_name for sae in splicers} & set(s.split(".")) or "SaeFeatures" in s)]
        saes = [sae for sae in splicers if any(sae.features_name in s.split(".") or "SaeFeatures" in s for s in named)]
        if not named or not saes or isinstance(hook, Sae):
            continue
        before = [sae for sae in saes if hooks.index(sae) < position]
        if not before:
            raise ConfigError(f"{hook.key}.layers: '{named[0]}' names the features of {saes[0].key}, which is listed "
                              f"after it; list {saes[0].key} first (hooks=[{saes[0].name},{hook.name}])")
        if hook.spec.first_step() < before[0].spec.first_step():
            raise ConfigError(f"{hook.key}.steps: starts at step {hook.spec.first_step()}, before {before[0].key} "
                              f"(step {before[0].spec.first_step()}) adds the features '{named[0]}' names")
