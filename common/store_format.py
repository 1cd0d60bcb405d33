"""The activation store's layout, declared once: written by ``hooks.formats.store_files``, read by ``runner.store.activations``.

A store directory (one per layer; under ``torch.distributed`` one ``rank-N`` part per rank) holds::

    store.json                  what the store holds (``store_header``) and its complete shards
    shard-00000.safetensors     tensor ``activations``: [rows, *item_shape] in the store's dtype
                                tensor ``samples``: [rows] int64, the dataset indices of those rows

``store.json`` names the format and the layout's version (``"format": "safetensors"``,
``"store_version": 2``) and lists each complete shard with its file, rows and first and last
sample id. Why safetensors: a file carries each tensor's dtype and shape in its header, so any
tool reads a shard with safetensors' own library and gets what the model gave, bfloat16
included (``safetensors.torch.load_file``; ``safetensors.numpy.load_file`` for float32 and
float16, numpy having no bfloat16). The layout before (store version 1, no ``format`` key) kept
``.npy`` shards, bfloat16 as its int16 bits, which ``np.load`` read back as integers without a
word; such a store is refused in one line (``read_store_manifest``).
"""
from __future__ import annotations

import json
from pathlib import Path

FORMAT = "safetensors"
STORE_VERSION = 2
MANIFEST = "store.json"
#: The dtypes a store keeps (torch's names for them, as ``store.json`` says them).
DTYPES = ("float32", "float16", "bfloat16")
#: The two tensors of each shard file.
ACTIVATIONS, SAMPLES = "activations", "samples"


def shard_name(index: int) -> str:
    """``shard-00003.safetensors``: the file of shard ``index``."""
    return f"shard-{index:05d}.{FORMAT}"


def store_header(layer: str, shard_size: int, dtype: str, rank: tuple[int, int] | None = None) -> dict:
    """What a store holds and how: a pass writes on in a store only when its header is this one."""
    return {"format": FORMAT, "store_version": STORE_VERSION, "layer": layer, "shard_size": shard_size,
            "dtype": dtype, **({"rank": rank[0], "world_size": rank[1]} if rank else {})}


def read_store_manifest(path: Path) -> dict | None:
    """The ``store.json`` of the store at ``path``, or ``None`` when none was written yet.

    Raises:
        ValueError: one line, for a store of another layout (the ``.npy`` one before, or a later one).
    """
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    if (manifest.get("format"), manifest.get("store_version")) != (FORMAT, STORE_VERSION):
        found = (f"{manifest['format']} store version {manifest.get('store_version')}" if "format" in manifest
                 else ".npy shards (store version 1, bfloat16 kept as int16 bits)")
        raise ValueError(f"store '{path}' holds {found}; this version reads and writes {FORMAT} store version "
                         f"{STORE_VERSION} only: run the pass again into another path (np.load reads the old "
                         f".npy shards)")
    return manifest
