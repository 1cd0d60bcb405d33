"""``data=text``: prompts tokenized offline by a ``save_pretrained`` tokenizer, each named by its text.

The prompts are ``data.prompts`` (strings) or ``data.path`` (a file, one prompt per line; blank
lines are skipped); the tokenizer is the folder ``data.tokenizer`` (null: the model's own folder,
``model.path`` of ``model=hf``), loaded with ``local_files_only``. Every prompt is padded on the
right to the longest one with the tokenizer's pad token (its end-of-text token when it has none):
a causal model's outputs at a prompt's own positions then never see a pad, so forward passes
(``mode=train|eval``) give each prompt's tokens exactly what they give alone. Generation moves the
pads to the left (``runner.engine.generation``), as ``model.generate`` needs. The items have a
length: ``mode=eval`` and ``mode=generate`` read them in order, sharded by ``data.shard``, and
name each sample by its prompt (``ItemRange.names``: what ``units`` keeps in ``unit_inputs.parquet``).
"""
from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.tokenizers import load_tokenizer
from runner.config.registry import DATA_KINDS
from runner.config.schema import TextData
from runner.sources.batches import ItemRange, Maker, numbered
from common.fingerprint import describe_bytes

if TYPE_CHECKING:
    from runner.config.schema import RunConfig
    from runner.sources.data import DataSource


@dataclass(frozen=True)
class Prompts:
    """The prompts as the model gets them: ``ids`` ``[n, longest]`` padded on the right with
    ``pad_id``, ``lengths`` each prompt's own tokens, and the ``tokenizer`` that decodes them."""

    texts: tuple[str, ...]
    ids: torch.Tensor
    lengths: torch.Tensor
    pad_id: int
    tokenizer: object
    fingerprints: dict = field(default_factory=dict)


@DATA_KINDS.register("text", schema=TextData)
def _text(data: DictConfig, model: DictConfig) -> Maker:
    """Batches of ``data.batch_size`` prompts (null: all of them) in order, one epoch after another."""
    if data.get("shape") is not None:
        raise ConfigError("data.shape: data=text takes its shape from the prompts; set data.batch_size instead")
    prompts = prompt_set(data, model)
    n = len(prompts.texts)
    size = n if data.get("batch_size") is None else int(data.batch_size)
    if size < 1:
        raise ConfigError(f"data.batch_size: {size} must be at least 1 (null: all {n} prompts in one batch)")

    def read(start: int, stop: int):
        for first in range(start, stop, size):
            yield prompts.ids[first:min(first + size, stop)].clone(), None

    items = ItemRange(n, size, read, lambda i: (prompts.texts[i], ""))
    return Maker([min(size, n), prompts.ids.shape[1]], torch.long,
                 lambda gen: (xy for _ in itertools.count() for xy in numbered(read, 0, n)),
                 epoch_steps=-(-n // size), items=items, fingerprints=prompts.fingerprints)


class PaddedPromptsWarning(UserWarning):
    """Forward passes over prompts of different lengths compute the pads too (``warn_of_pads``)."""


def warn_of_pads(settings: RunConfig, data: DataSource) -> None:
    """Say, before a forward pass (``mode=train|eval``) over ``data=text``, how many prompts are padded:
    the pad positions are computed like tokens, so statistics over positions (``units``, ``stats``)
    count them, and position -1 (the metric, ``dla``, ``logit_lens``) is a pad for a shorter prompt.
    ``mode=generate`` masks them (``attention_mask``), so it says nothing."""
    if data.kind != "text" or settings.mode.value == "generate":
        return
    prompts = prompt_set(data.data, data.model)
    short = int((prompts.lengths < prompts.ids.shape[1]).sum())
    if short:
        warnings.warn(PaddedPromptsWarning(
            f"data=text: {short} of {len(prompts.texts)} prompts are shorter than the longest ({prompts.ids.shape[1]} "
            f"tokens) and padded on the right with token {prompts.pad_id}, which forward passes compute too: units and "
            f"stats count the pads, and position -1 is a pad for those prompts; give prompts of one length to leave "
            f"them out"), stacklevel=2)


def prompt_set(data: DictConfig, model: DictConfig) -> Prompts:
    """The checked prompts of ``data``, tokenized; every mistake is one line naming its key. Tokenized once
    per run: the data kind, the gate's ``warn_of_pads`` and ``mode=generate`` all ask for them (a prompt
    file that changed on disk, by size or time, is read again)."""
    path = data.get("path")
    stamp = None
    if path and Path(str(path)).is_file():
        found = Path(str(path)).stat()
        stamp = (found.st_size, found.st_mtime_ns)
    return _tokenized(OmegaConf.to_yaml(data), OmegaConf.to_yaml(model), stamp)


@functools.lru_cache(maxsize=4)
def _tokenized(data_yaml: str, model_yaml: str, stamp: tuple[int, int] | None) -> Prompts:
    """``prompt_set`` of the configs as YAML (hashable); ``stamp``: the prompt file's size and time, in the key."""
    data, model = OmegaConf.create(data_yaml), OmegaConf.create(model_yaml)
    texts, fingerprints = _texts(data)
    folder = tokenizer_folder(data, model)
    tokenizer = load_tokenizer(folder)
    vocab = model.get("num_classes")
    if vocab is not None and len(tokenizer) > int(vocab):
        raise ConfigError(f"data.tokenizer: '{folder}' has {len(tokenizer)} tokens but the model's vocabulary is "
                          f"{vocab} (model.num_classes); use the model's own tokenizer")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ConfigError(f"data.tokenizer: '{folder}' has neither a pad token nor an end-of-text token to pad with")
    encoded = [list(tokenizer(text)["input_ids"]) for text in texts]
    for text, ids in zip(texts, encoded):
        if not ids:
            raise ConfigError(f"data.prompts: {text!r} is no token of the tokenizer '{folder}'")
    longest = max(map(len, encoded))
    ids = torch.tensor([row + [pad] * (longest - len(row)) for row in encoded], dtype=torch.long)
    lengths = torch.tensor([len(row) for row in encoded], dtype=torch.long)
    return Prompts(tuple(texts), ids, lengths, int(pad), tokenizer, fingerprints)


def _texts(data: DictConfig) -> tuple[list[str], dict]:
    """``data.prompts``, or the lines of the file ``data.path`` (with its fingerprint), never both."""
    given, path = list(data.get("prompts") or []), data.get("path")
    if bool(given) == bool(path):
        raise ConfigError("data.prompts: data=text needs prompts: data.prompts=['...','...'] or data.path=FILE "
                          f"(one prompt per line), not {'both' if given else 'neither'}")
    if given:
        for text in given:
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"data.prompts: {text!r} is not a prompt (a non-empty string)")
        return given, {}
    file = Path(str(path))
    if not file.is_file():
        raise ConfigError(f"data.path: no file at '{file}' (data=text reads one prompt per line)")
    raw = file.read_bytes()
    try:
        lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise ConfigError(f"data.path: '{file}' is not UTF-8 text: {exc}") from None
    if not lines:
        raise ConfigError(f"data.path: '{file}' holds no prompt (one per line)")
    return lines, {str(path): describe_bytes(file, raw)}


def tokenizer_folder(data: DictConfig, model: DictConfig) -> str:
    """``data.tokenizer``, else the folder of a ``model=hf`` model; checked to be a folder."""
    folder = data.get("tokenizer") or (model.get("path") if model.get("name") == "hf" else None)
    if not folder:
        raise ConfigError("data.tokenizer: required for data=text with a model that has no folder of its own "
                          "(model=hf uses model.path); give a save_pretrained tokenizer folder: data.tokenizer=DIR")
    if not Path(str(folder)).is_dir():
        raise ConfigError(f"data.tokenizer: no folder at '{folder}' (a tokenizer saved with save_pretrained)")
    return str(folder)
