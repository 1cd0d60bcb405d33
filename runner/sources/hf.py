"""``model=hf model.path=DIR``: a Hugging Face model saved with ``save_pretrained``, loaded offline.

``check_hf`` reads only ``DIR/config.json`` (at plan time: a missing directory or config is one
line before anything runs) and takes the vocabulary size from it for ``data=tokens``;
``load_hf`` calls the chosen Auto class's ``from_pretrained`` with ``local_files_only=True``, so
nothing is ever downloaded. On the meta device (the plan's rehearsal) it builds the architecture
from the config alone, reading no weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from hooks.errors import ConfigError, choice_error

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
        return auto.from_pretrained(cfg.path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ConfigError(f"model.path: cannot load '{cfg.path}' with {AUTO_CLASSES[cfg.auto]}: {detail}") from None
