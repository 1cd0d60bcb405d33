"""What a replay needs to know about how a run was made, beyond its config: the manifest's ``provenance``.

``config.yaml`` says what was asked for; it does not say which files it read, what they held, or how
many threads on which device computed it. ``provenance(plan)`` records that (the data's kind and
shape, each file the data or the checkpoint names with a fingerprint, the seed, torch's thread
count, the device), and
``differences(stored, now)`` names, one short phrase each, what a replay would do otherwise.
Versions are not here: the manifest keeps them under ``versions`` (``runner.store.outputs``).
"""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from common.fingerprint import describe_file

#: Keys of a data config that name a file or a folder of files.
PATH_KEYS = ("path", "root")


def provenance(plan) -> dict:
    """The manifest's ``provenance`` of ``plan`` (a ``runner.engine.plan.Plan``)."""
    return {
        "seed": plan.settings.seed,
        "threads": torch.get_num_threads(),
        "device": plan.device,
        "data": describe_data(plan.data.data, plan.data.input_shape, plan.data.fingerprints),
        "checkpoint": describe_file(plan.model.get("checkpoint")),
    }


def describe_data(cfg: DictConfig, shape, known: dict[str, dict] | None = None) -> dict:
    """The data's kind, input shape and, for each path key, the fingerprint of what it names
    (``known``: the fingerprints the data kind took of the bytes it read, by path, so that a file is
    read once per run)."""
    described = {"kind": cfg.get("kind"), "shape": list(shape) if shape is not None else None}
    for key in PATH_KEYS:
        if cfg.get(key):
            described[key] = (known or {}).get(str(cfg.get(key))) or describe_file(cfg.get(key))
    return described


def differences(stored: dict, now: dict, prefix: str = "") -> list[str]:
    """Every leaf where two manifest parts differ, as ``key: stored -> now`` (a key only one has too)."""
    out = []
    for key in sorted(set(stored) | set(now), key=str):
        a, b = stored.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return out


def _short(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return "(none)" if value is None else str(value)
