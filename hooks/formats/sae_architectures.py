"""What each architecture SAELens 6 saves computes at inference, in torch alone (sae-lens is never imported):
the tensors its ``sae_weights.safetensors`` holds, its weights as sae-lens's inference SAE holds them, and its
encode and decode between the processed input (``hooks.formats.sae_format``: cast, normalized, ``b_dec`` taken off)
and the reconstruction before it is normalized back. Each repeats sae-lens's own operations in their order
(``sae_lens/saes/*_sae.py``), so that its features are sae-lens's bit for bit on the same torch:

- ``standard`` (``StandardSAE``): ``relu(x W_enc + b_enc)``.
- ``jumprelu`` (``JumpReLUSAE``): ``relu(pre) * (pre > threshold)``, ``pre = x W_enc + b_enc``.
- ``topk`` (``TopKSAE``): ``pre`` (times each decoder row's norm with ``rescale_acts_by_decoder_norm``), its ``k``
  largest in each vector (``torch.topk``, ``sorted=False``) relu'd, the rest 0; decode divides the features by
  those norms again. The dense decode: ``TopKSAE`` never makes sparse features. Where several
  pre-activations tie at the ``k``-th largest, which of them ``torch.topk`` keeps is its implementation's
  choice (the kept values are the same).
- ``batchtopk``: the folder ``BatchTopKTrainingSAE.save_model`` writes (``topk_threshold``, one float64). Its
  encode over a batch keeps the ``k x vectors`` largest of the whole batch, so a vector's features depend on
  the others; sae-lens's inference SAE for it is the ``JumpReLUSAE`` that ``save_inference_model`` writes
  (``architecture: jumprelu``, read as such): ``threshold`` is ``topk_threshold`` for every feature, the
  decoder norms folded into ``W_enc``, ``b_enc`` and ``W_dec`` with ``rescale_acts_by_decoder_norm``. That
  is what this folder is read as.
- ``gated`` (``GatedSAE``): ``(x W_enc + b_gate > 0) * relu(x (W_enc * exp(r_mag)) + b_mag)``.

Every architecture decodes ``f W_dec + b_dec`` (``topk``: see above).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from common.errors import ConfigError

Weights = dict[str, torch.Tensor]
#: The dictionary's tensors every architecture has, with their dims.
LINEAR = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}


def relu_encode(w: Weights, x: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    return torch.relu(x @ w["W_enc"] + w["b_enc"])


def jumprelu_encode(w: Weights, x: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    pre = x @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(pre)
    return acts * (pre > w["threshold"]).to(acts.dtype)


def topk_rescaled(cfg: dict[str, Any]) -> bool:
    """``rescale_acts_by_decoder_norm`` of a ``topk`` SAE (``TopKSAEConfig``'s default: off)."""
    return bool(cfg.get("rescale_acts_by_decoder_norm", False))


def topk_encode(w: Weights, x: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    pre = x @ w["W_enc"] + w["b_enc"]
    if topk_rescaled(cfg):
        pre = pre * w["W_dec"].norm(dim=-1)
    values, indices = torch.topk(pre, k=cfg["k"], dim=-1, sorted=False)
    return torch.zeros_like(pre).scatter_(-1, indices, values.relu())


def gated_encode(w: Weights, x: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    active = (x @ w["W_enc"] + w["b_gate"] > 0).to(x.dtype)
    return active * torch.relu(x @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"])


def linear_decode(w: Weights, features: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    return features @ w["W_dec"] + w["b_dec"]


def topk_decode(w: Weights, features: torch.Tensor, cfg: dict[str, Any]) -> torch.Tensor:
    if topk_rescaled(cfg):
        features = features * (1 / w["W_dec"].norm(dim=-1))
    return linear_decode(w, features, cfg)


def batchtopk_as_jumprelu(w: Weights, cfg: dict[str, Any]) -> Weights:
    """The weights ``BatchTopKTrainingSAE.save_inference_model`` writes (``TopKTrainingSAE``'s fold of the
    decoder norms, on by default there, then ``threshold``), from those ``save_model`` wrote."""
    w = dict(w)
    if cfg.get("rescale_acts_by_decoder_norm", True):
        norms = w["W_dec"].norm(dim=-1).clamp(min=1e-8)
        w["b_enc"] = w["b_enc"] * norms
        w["W_dec"] = w["W_dec"] / norms.unsqueeze(1)
        w["W_enc"] = w["W_enc"] * norms.unsqueeze(1).T
    w["threshold"] = torch.ones_like(w["b_enc"]) * w.pop("topk_threshold").item()
    return w


def unchanged(w: Weights, cfg: dict[str, Any]) -> Weights:
    return w


def check_k(cfg: dict[str, Any], where: str) -> None:
    """A ``topk`` SAE's ``k``: how many features each vector keeps, at most ``d_sae``."""
    k = cfg.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg["d_sae"]:
        raise ConfigError(f"{where} has k={k!r}; a topk SAE keeps k features of each vector, an integer from 1 "
                          f"to d_sae={cfg['d_sae']}")


def no_options(cfg: dict[str, Any], where: str) -> None:
    return None


@dataclass(frozen=True)
class Architecture:
    """One architecture: its file's tensors, how sae-lens's inference SAE holds them, its encode and decode."""

    tensors: dict[str, tuple[str, ...]]
    encode: Callable[[Weights, torch.Tensor, dict[str, Any]], torch.Tensor]
    decode: Callable[[Weights, torch.Tensor, dict[str, Any]], torch.Tensor] = linear_decode
    for_inference: Callable[[Weights, dict[str, Any]], Weights] = unchanged
    check: Callable[[dict[str, Any], str], None] = no_options  #: its own ``cfg.json`` keys, else one line


ARCHITECTURES: dict[str, Architecture] = {
    "standard": Architecture(LINEAR, relu_encode),
    "jumprelu": Architecture({**LINEAR, "threshold": ("d_sae",)}, jumprelu_encode),
    "topk": Architecture(LINEAR, topk_encode, topk_decode, check=check_k),
    "batchtopk": Architecture({**LINEAR, "topk_threshold": ()}, jumprelu_encode, for_inference=batchtopk_as_jumprelu),
    "gated": Architecture({"W_enc": ("d_in", "d_sae"), "b_gate": ("d_sae",), "b_mag": ("d_sae",),
                           "r_mag": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}, gated_encode),
}
