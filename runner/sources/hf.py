"""``model=hf model.path=DIR``: a Hugging Face model saved with ``save_pretrained``, loaded offline.

``check_hf`` reads only ``DIR/config.json`` (at plan time: a missing directory or config is one
line before anything runs) and takes the vocabulary size from it for ``data=tokens``;
``load_hf`` calls the chosen Auto class's ``from_pretrained`` with ``local_files_only=True``, so
nothing is ever downloaded. On the meta device (the plan's rehearsal) it builds the architecture
from the config alone, reading no weights. ``model.device_map`` (with ``model.offload_folder``
for modules mapped to ``"disk"``) loads it across devices and disk with accelerate; its forward
hooks, edits and captures then act on each layer's outputs where that layer ran.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from common.errors import ConfigError, choice_error

#: ``model.auto`` -> the ``transformers`` Auto class that loads the directory.
AUTO_CLASSES = {"model": "AutoModel", "causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
                "sequence_classification": "AutoModelForSequenceClassification"}


def check_hf(cfg: DictConfig) -> DictConfig:
    """Check ``model.path`` and ``model.auto``; fill ``num_classes`` (null) with config.json's ``vocab_size``."""
    if OmegaConf.is_missing(cfg, "path"):
        raise ConfigError("model.path: required for model=hf, e.g. model.path=DIR (a save_pretrained directory)")
    if cfg.auto not in AUTO_CLASSES:
        raise choice_error("model.auto", cfg.auto, AUTO_CLASSES, "Auto class")
    path = Path(str(cfg.path))
    if not path.is_dir():
        raise ConfigError(f"model.path: no directory at '{path}' (model=hf loads a save_pretrained directory)")
    config = path / "config.json"
    if not config.is_file():
        raise ConfigError(f"model.path: '{path}' has no config.json; is it a save_pretrained directory?")
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path: cannot read '{config}': {exc}") from None
    if cfg.num_classes is None and isinstance(fields, dict) and fields.get("vocab_size"):
        cfg.num_classes = int(fields["vocab_size"])
    return cfg


def placement(cfg: DictConfig) -> dict:
    """``from_pretrained``'s ``device_map`` and ``offload_folder`` from ``model.device_map`` and
    ``model.offload_folder`` (none when unset: the model loads whole, on the CPU)."""
    out = {}
    if cfg.get("device_map") is not None:
        value = cfg.device_map
        out["device_map"] = OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
    if cfg.get("offload_folder"):
        out["offload_folder"] = str(cfg.offload_folder)
    return out


def placed(model: nn.Module, device: str | torch.device) -> nn.Module:
    """``model`` on ``device``, unless a ``device_map`` placed it: accelerate's hooks then move each
    layer's weights (from the CPU or the disk) to its own device around its call, and moving the
    whole model would undo that (accelerate refuses it when some weights are on the disk)."""
    return model if getattr(model, "hf_device_map", None) else model.to(device)


def load_hf(cfg: DictConfig) -> nn.Module:
    """The model in ``cfg.path`` through ``transformers``' ``AUTO_CLASSES[cfg.auto]``, offline."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("model=hf needs the 'transformers' package: pip install -e '.[transformers]'") from None
    auto = getattr(transformers, AUTO_CLASSES[cfg.auto])
    try:
        if torch.get_default_device().type == "meta":  # the rehearsal: shapes only, no weights read
            return auto.from_config(transformers.AutoConfig.from_pretrained(cfg.path, local_files_only=True))
        with _no_progress_bar(transformers):
            return auto.from_pretrained(cfg.path, local_files_only=True, **placement(cfg))
    except (OSError, ValueError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ConfigError(f"model.path: cannot load '{cfg.path}' with {AUTO_CLASSES[cfg.auto]}: {detail}") from None


@contextmanager
def _no_progress_bar(transformers):
    """``transformers``' progress bar off while a local folder loads (a bar per job of a sweep on the terminal,
    ``quiet=true`` included, for a read of milliseconds), back as it was afterwards: the caller's process
    keeps its setting."""
    bars = transformers.utils.logging
    was_on = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            bars.enable_progress_bar()
