"""Whether the model a ``mode=generate`` config names can generate, asked of its config alone (no torch).

It is asked first, before the data and the epochs are looked at: every later answer of a
generation run (no tokenizer, no length to count epochs in, ...) follows from a model that cannot
generate, so the model is what the user has to change. A check of the gate (``runner.engine.plan.GATE``),
made once per compile; it needs no torch, so a config's own check could ask it before torch is imported.
"""
from __future__ import annotations

from common.errors import ConfigError

#: What a refusal of the model proposes instead.
CAUSAL_LM = "use a causal language model: model=hf model.auto=causal_lm, or model=gpt2_tiny"


def check_generate_model(mode: object, model) -> None:
    """Under ``mode=generate``, refuse a model that takes no token ids (``model.input_kind`` is not
    ``tokens``: a vision model, a plain network), naming what generation needs instead."""
    if str(getattr(mode, "value", mode)) != "generate" or model.get("input_kind") == "tokens":
        return
    name = model.get("name") or model.get("_target_")
    raise ConfigError(f"mode=generate: model {name} takes no token ids (model.input_kind="
                      f"{model.get('input_kind')}), so it cannot generate text; generation needs a causal language "
                      f"model and data=text: {CAUSAL_LM.removeprefix('use a causal language model: ')}")
