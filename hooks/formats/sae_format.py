"""A sparse autoencoder read from a SAELens folder (``cfg.json`` + ``sae_weights.safetensors``), with
SAELens 6's own encode and decode, and the contract every SAE the ``sae`` hook type splices keeps.

The contract (``check_sae``): an object with ``encode(x) -> features`` (``[..., d_in]`` to
``[..., d_sae]``), ``decode(features) -> x`` and ``W_dec`` of shape ``[d_sae, d_in]``; a loader named
by ``hooks.NAME._target_`` is called with the folder and returns one (a SAELens ``SAE`` does).

The SAELens folder (``load_saelens``), as ``sae_lens.SAE.save_model`` writes it: ``W_enc``
``[d_in, d_sae]``, ``b_enc`` ``[d_sae]``, ``W_dec`` ``[d_sae, d_in]``, ``b_dec`` ``[d_in]``, and for
``jumprelu`` a ``threshold`` ``[d_sae]``. Encode (``sae_lens.saes.sae.SAE.process_sae_in``, then
``StandardSAE.encode`` / ``JumpReLUSAE.encode``) casts the input to the SAE's dtype, normalizes it
(``normalize_activations``), subtracts ``b_dec`` when ``apply_b_dec_to_input``, and gives
``relu(x W_enc + b_enc)``, for ``jumprelu`` zeroed where the pre-activation is not above
``threshold``. Decode gives ``f W_dec + b_dec``, normalized back with the statistics of the last
encode, as SAELens keeps them. Other architectures (topk, gated, ...), an input normalization the
folder cannot carry (``expected_average_only_in``, ``covariance_whitening``: SAELens folds their
factors in only when it downloads) and ``hook_z`` reshaping are refused in one line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from common.errors import ConfigError, choice_error

CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu")
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
#: The tensors of each architecture, with their shapes as (d_in, d_sae) make them.
SHAPES = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}
LAYER_NORM_EPS = 1e-5  #: SAELens's ``run_time_activation_ln_in`` default


class SaeLensSae:
    """A SAELens ``standard`` or ``jumprelu`` SAE for inference: ``encode`` and ``decode`` as SAELens 6
    computes them (see the module docstring), its tensors moved to each input's device on first use."""

    def __init__(self, tensors: dict[str, torch.Tensor], architecture: str, apply_b_dec_to_input: bool,
                 normalize_activations: str) -> None:
        self.tensors = tensors
        self.architecture = architecture
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.normalize_activations = normalize_activations
        self._on: dict[torch.device, dict[str, torch.Tensor]] = {}
        self._norm: tuple[torch.Tensor, torch.Tensor] | None = None  # (shift, scale) of the last encode

    @property
    def W_dec(self) -> torch.Tensor:  # noqa: N802 - SAELens's name, which the contract reads
        return self.tensors["W_dec"]

    def _at(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._on:
            self._on[device] = {name: t.to(device) for name, t in self.tensors.items()}
        return self._on[device]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        w = self._at(x.device)
        x = self._normalized(x.to(w["W_enc"].dtype))
        if self.apply_b_dec_to_input:
            x = x - w["b_dec"]
        pre = x @ w["W_enc"] + w["b_enc"]
        acts = torch.relu(pre)
        if self.architecture == "jumprelu":
            acts = acts * (pre > w["threshold"]).to(acts.dtype)
        return acts

    def decode(self, features: torch.Tensor) -> torch.Tensor:
        w = self._at(features.device)
        out = features @ w["W_dec"] + w["b_dec"]
        if self._norm is not None:
            shift, scale = self._norm
            out = out * scale + shift
        return out

    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as SAELens normalizes it on the way in; keeps what decode needs to undo it."""
        if self.normalize_activations == "constant_norm_rescale":
            coeff = x.shape[-1] ** 0.5 / x.norm(dim=-1, keepdim=True)
            self._norm = (torch.zeros((), dtype=x.dtype, device=x.device), 1 / coeff)
            return x * coeff
        if self.normalize_activations == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            x = x - mu
            std = x.std(dim=-1, keepdim=True)
            self._norm = (mu, std)
            return x / (std + LAYER_NORM_EPS)
        return x


def read_config(path: Path, key: str) -> dict[str, Any]:
    """The folder's ``cfg.json``, checked: a supported architecture and normalization, no reshaping."""
    if not path.is_dir():
        raise ConfigError(f"{key}: no folder at '{path}'; an SAE in SAELens's format is a folder holding "
                          f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ConfigError(f"{key}: '{path}' has no {name}; an SAE in SAELens's format is a folder holding "
                              f"{CONFIG_FILE} and {WEIGHTS_FILE} (other formats: a loader in "
                              f"{key.rsplit('.', 1)[0]}._target_)")
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key}: '{path / CONFIG_FILE}' is not readable JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{key}: '{path / CONFIG_FILE}' holds {type(cfg).__name__}, not a mapping")
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise ConfigError(f"{key}: the SAE at '{path}' has architecture '{architecture}'; supported: "
                          f"{', '.join(ARCHITECTURES)}")
    if cfg.get("normalize_activations", "none") not in NORMALIZATIONS:
        raise choice_error(f"{key}: the SAE at '{path}' has normalize_activations",
                           cfg["normalize_activations"], NORMALIZATIONS, "normalization")
    if cfg.get("reshape_activations", "none") != "none":
        raise ConfigError(f"{key}: the SAE at '{path}' has reshape_activations "
                          f"'{cfg['reshape_activations']}'; supported: none (splice it at the concatenated heads)")
    for name in ("d_in", "d_sae"):
        if not isinstance(cfg.get(name), int) or cfg[name] < 1:
            raise ConfigError(f"{key}: '{path / CONFIG_FILE}' has {name}={cfg.get(name)!r}; a positive integer")
    return cfg


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(cfg[dim] for dim in dims) for name, dims in SHAPES.items()}
    if cfg.get("architecture", "standard") == "jumprelu":
        shapes["threshold"] = (cfg["d_sae"],)
    return shapes


def check_saelens(folder: str, key: str) -> dict[str, Any]:
    """Refuse, reading only the headers, a folder that is not a supported SAELens SAE: the config as
    ``read_config`` checks it, and the weight file holding exactly the architecture's tensors in
    their shapes. Returns the config."""
    path = Path(folder)
    cfg = read_config(path, key)
    wanted = expected_shapes(cfg)
    try:
        with safe_open(path / WEIGHTS_FILE, framework="pt") as f:
            found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a broken file
        raise ConfigError(f"{key}: '{path / WEIGHTS_FILE}' is not a readable safetensors file: {exc}") from None
    for name in sorted(found.keys() | wanted.keys()):
        if name not in found:
            raise ConfigError(f"{key}: '{path / WEIGHTS_FILE}' has no tensor '{name}' (a {cfg.get('architecture', 'standard')} "
                              f"SAE has {', '.join(wanted)})")
        if name not in wanted:
            raise ConfigError(f"{key}: '{path / WEIGHTS_FILE}' holds '{name}', which a "
                              f"{cfg.get('architecture', 'standard')} SAE does not have ({', '.join(wanted)})")
        if found[name] != wanted[name]:
            raise ConfigError(f"{key}: '{path / WEIGHTS_FILE}' holds '{name}' of shape {list(found[name])}; "
                              f"d_in={cfg['d_in']}, d_sae={cfg['d_sae']} in {CONFIG_FILE} make it {list(wanted[name])}")
    return cfg


def load_saelens(folder: str, cfg: dict[str, Any] | None = None) -> SaeLensSae:
    """The SAE in the SAELens folder ``folder`` (checked by ``check_saelens`` when the entry was built),
    in the dtype of its ``cfg.json`` (default float32); ``cfg``: that file as the entry read it."""
    cfg = read_config(Path(folder), "sae") if cfg is None else cfg
    dtype = getattr(torch, str(cfg.get("dtype", "float32")).removeprefix("torch."))
    with safe_open(Path(folder) / WEIGHTS_FILE, framework="pt") as f:
        tensors = {name: f.get_tensor(name).to(dtype) for name in f.keys()}  # noqa: SIM118
    return SaeLensSae(tensors, cfg.get("architecture", "standard"), bool(cfg.get("apply_b_dec_to_input", True)),
                      cfg.get("normalize_activations", "none"))


def host_bytes(sae: Any) -> int:
    """Bytes of the SAE's tensors held on the host: a module's parameters and buffers, a SAELens folder's
    tensors (``SaeLensSae.tensors``), else its ``W_dec``."""
    tensors = (sae.state_dict().values() if isinstance(sae, torch.nn.Module)
               else getattr(sae, "tensors", {"W_dec": sae.W_dec}).values())
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == "cpu")


def check_sae(sae: Any, key: str) -> tuple[int, int]:
    """``(d_in, d_sae)`` of a loaded SAE keeping the contract (module docstring), else one line."""
    missing = [name for name in ("encode", "decode") if not callable(getattr(sae, name, None))]
    w_dec = getattr(sae, "W_dec", None)
    if missing or not isinstance(w_dec, torch.Tensor) or w_dec.dim() != 2:
        lacks = ", ".join(missing + ([] if isinstance(w_dec, torch.Tensor) and w_dec.dim() == 2 else ["W_dec [d_sae, d_in]"]))
        raise ConfigError(f"{key}: the loader returned a {type(sae).__name__} without {lacks}; an SAE has "
                          f"encode(x), decode(features) and W_dec of shape [d_sae, d_in]")
    d_sae, d_in = w_dec.shape
    return int(d_in), int(d_sae)
