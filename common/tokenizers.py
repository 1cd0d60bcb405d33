"""A ``save_pretrained`` tokenizer folder read offline, once per process: the one reader of the data source that
encodes prompts, the ``graph`` entry that names its nodes' tokens and the graph export that decodes a prompt."""
from __future__ import annotations

import functools

from common.errors import ConfigError


@functools.lru_cache(maxsize=4)
def load_tokenizer(folder: str, key: str = "data.tokenizer"):
    """``AutoTokenizer.from_pretrained(folder)`` offline (nothing is ever downloaded); a missing ``transformers``
    or a folder it cannot read is one line naming ``key``."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(f"{key}: reading a tokenizer needs the 'transformers' package: "
                          f"pip install -e '.[transformers]'") from None
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ConfigError(f"{key}: cannot load a tokenizer from '{folder}': {detail}") from None
