"""Property test: random hook configs over every registered hook type and selector form.

Whatever hypothesis draws (types, selectors, values of each type's own keys, stray keys), on
the small models a config either runs to a complete run directory or fails with one
``ConfigError`` line that starts with the key at fault, before any forward pass and with nothing
written; either way every hook dict is exactly as before. Values come from each type's spec
dataclass, so a newly registered hook type is covered without editing this test.
"""
from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import open_dict

from conftest import assert_no_partial_output, make_config, run, watching
from common.errors import ConfigError
from hooks import HOOK_TYPES
from runner.config.registry import MODELS

SMALL_MODELS = [name for name in MODELS if name != "hf"]  #: the registered models built without files

MODULES = {"mlp": ["fc1", "relu", "fc2"], "convnet": ["conv", "relu", "flatten", "fc"], "linear": [],
           "digits_cnn": ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc"]}
SELECTOR_FORMS = ["", "*", "**", "leaf:**", "type:Linear", "type:ReLU", "re:fc.*", "leaf:*", "f*"]
BAD_SELECTORS = ["nope", "type:Nope", "re:nope.*"]
#: Strings a str or list[str] key is drawn from: every string default of every spec, plus the
#: other values the built-in types know and a word none of them knows.
WORDS = sorted({f.default for name in HOOK_TYPES for f in dataclasses.fields(HOOK_TYPES.get(name).schema)
                if isinstance(f.default, str)} | {"output", "input", "params", "grad_output", "mul", "set",
                                                   "weight", "bias", "bogus"})
KEY_AT_FAULT = re.compile(r"^hooks\.\w+(\.\w+|\[\d+\])*: ")


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True with probability about 1/n (``integers`` would favour the bounds)."""
    return st.sampled_from([False] * (n - 1) + [True])


@st.composite
def value_for(draw, field: dataclasses.Field):
    """The field's default two times in three; else a value of its kind (from the default's type),
    valid or not: any float, NaN or null for floats, any known word for strings and lists."""
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    kind = str(field.type)
    if "float" in kind:
        values = st.floats(-10, 10, width=32) | st.just(float("nan"))
    elif "list" in kind:
        values = st.lists(st.sampled_from(WORDS), max_size=3)
    elif isinstance(default, str):
        values = st.sampled_from(WORDS)
    else:
        return default
    if "Optional" in kind:
        values = values | st.none()
    return draw(values) if draw(one_in(3)) else default


@st.composite
def hook_entry(draw, modules: list[str]) -> tuple[dict, bool]:
    """One ``hooks.NAME`` entry and whether it is bad by construction."""
    type_name = draw(st.sampled_from(sorted(HOOK_TYPES)))
    selector = st.builds(lambda bad, good, wrong: wrong if bad else good, one_in(6),
                         st.sampled_from(modules + SELECTOR_FORMS), st.sampled_from(BAD_SELECTORS))
    layers = draw(selector | st.lists(selector, min_size=1, max_size=3))
    entry = {"type": type_name, "layers": layers}
    for field in dataclasses.fields(HOOK_TYPES.get(type_name).schema):
        if field.name not in entry and draw(one_in(2)):
            entry[field.name] = draw(value_for(field))
    stray = draw(one_in(8))
    if stray:
        entry["bogus_key"] = 1
    bad_selector = any(s in BAD_SELECTORS for s in ([layers] if isinstance(layers, str) else layers))
    return entry, stray or bad_selector


@st.composite
def experiment(draw) -> tuple[tuple[str, str], dict, bool]:
    model = draw(st.sampled_from(sorted(MODULES)))
    loss = "none" if draw(one_in(4)) else "sum"
    entries = draw(st.lists(hook_entry(MODULES[model]), min_size=1, max_size=2))
    hooks = {f"h{i}": entry for i, (entry, _) in enumerate(entries)}
    return (model, loss), hooks, any(bad for _, bad in entries)


def test_the_generator_knows_every_model():
    assert set(MODULES) == set(SMALL_MODELS)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiment())
def test_random_hook_configs_run_cleanly_or_fail_before_any_forward_pass(case):
    base, hooks, must_fail = case
    model, loss = base
    cfg = make_config(f"model={model}", f"loss={loss}", "on_nonfinite=ignore")  # composed once per process
    with open_dict(cfg):
        cfg.hooks = hooks
    with tempfile.TemporaryDirectory() as tmp, watching() as watched:
        out = Path(tmp) / "out"
        try:
            run(cfg, out)
        except ConfigError as exc:
            message = str(exc)
            event("rejected: " + message.split(":", 1)[1][:45])
            assert KEY_AT_FAULT.match(message), message
            assert "\n" not in message
            assert watched.forwards == 0, message
            assert_no_partial_output(out)
        else:
            event("ran")
            assert not must_fail, hooks
            assert (out / "manifest.json").is_file()
        watched.assert_untouched()
