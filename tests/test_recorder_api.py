"""The recorder's and the session's public API: on/off, phase labels, the counting mode, the tally,
activation-checkpointing recompute, complex tensors, the record schema and silent entries."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conftest import make_config
from common.records import ID_COLUMNS, ID_FIELDS, KINDS, PHASES, STAT_COLUMNS, STAT_FIELDS
from hooks import ConfigError, HOOK_TYPES, HookSession, build_hooks
from hooks.mechanism.recorder import Recorder, Tally
from hooks.mechanism.registry import build_hook

pytestmark = pytest.mark.statistics

ROW = dict(hook="h", layer="l", phase="forward", kind="output", slot="0", call=0)


def test_set_enabled_and_relabel():
    rec = Recorder()
    rec.set_enabled(False)
    rec.record(torch.ones(3), **ROW)
    rec.set_enabled(True)
    rec.record(torch.ones(3), **ROW)
    with rec.relabel("eval"):
        rec.record(torch.ones(3), **{**ROW, "phase": "backward"})
    rec.record(torch.ones(3), **ROW)
    assert rec.drain().columns["phase"] == ["forward", "eval", "forward"]


def test_counting_mode_records_identifiers_and_sizes_only():
    rec = Recorder(statistics=False)
    rec.record(torch.empty(4, 8, device="meta"), **ROW, keep=True)
    rec.record(torch.empty(3, dtype=torch.float64, device="meta"), **{**ROW, "kind": "grad_output"})
    out = rec.drain()
    assert len(out) == 2 and out.columns["tensor_shape"] == [[4, 8], [3]]
    assert out.stats == {} and out.kept == []
    assert rec.tally() == {("h", "output"): Tally(1, 128, 128), ("h", "grad_output"): Tally(1, 24, 0)}


def test_tally_survives_drain_and_sums_over_layers():
    rec = Recorder()
    for layer in ("a", "b"):
        rec.record(torch.ones(2, 5), **{**ROW, "layer": layer})
        rec.drain()
    assert rec.tally() == {("h", "output"): Tally(2, 80, 0)}
    assert rec.tally(by_layer=True)[("h", "b", "output")] == Tally(1, 40, 0)


def test_complex_tensors_get_statistics_of_each_part():
    z = torch.complex(torch.tensor([3.0, -1.0, 0.0]), torch.tensor([4.0, 2.0, -6.0]))
    rec = Recorder()
    rec.record(z, **ROW)
    out = rec.drain()
    assert out.columns["slot"] == ["0.real", "0.imag"] and out.columns["dtype"] == ["complex64"] * 2
    for i, part in enumerate((z.real, z.imag)):
        assert out.stats["mean"][i] == pytest.approx(part.mean().item())
        assert out.stats["l2"][i] == pytest.approx(part.norm().item())
        assert out.stats["min"][i] == part.min().item()


class Checkpointed(nn.Module):
    """A block run under ``torch.utils.checkpoint`` (non-reentrant), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(checkpoint(self.block, x, use_reentrant=False))


def test_checkpoint_recompute_is_phase_recompute_with_the_same_call():
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(3, 4)
    with HookSession(model, build_hooks({"s": {"type": "stats", "layers": "block.0",
                                                 "kinds": ["output", "grad_output"]}})) as session:
        session.backward(model(x).sum())
        out = session.recorder.drain()
    rows = sorted(zip(out.columns["phase"], out.columns["kind"], out.columns["call"]))
    assert rows == [("backward", "grad_output", 0), ("forward", "output", 0), ("recompute", "output", 0)]
    means = dict(zip(out.columns["phase"], out.stats["mean"]))
    assert means["recompute"] == means["forward"] == pytest.approx(model.block[0](x).mean().item())


def test_record_schema_is_one_table():
    assert ID_COLUMNS == tuple(f.name for f in ID_FIELDS)[1:]
    assert STAT_COLUMNS == tuple(f.name for f in STAT_FIELDS)
    assert {"saved", "param_grad"} <= set(KINDS) and "recompute" in PHASES


# -- NaN and ±Inf hook parameters, for every type ------------------------------------------------
PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "hooks").glob("*.yaml")
                 if p.stem != "none")
#: Every preset's entry, composed once (``hooks=[a,b,...]`` gives each the entry ``hooks=a`` gives it).
ENTRIES = make_config(f"hooks=[{','.join(PRESETS)}]", "model=resnet18").hooks
FLOAT_KEYS = []
for _preset in PRESETS:
    _spec_class = HOOK_TYPES.get(ENTRIES[_preset].type).schema
    for _f in dataclasses.fields(_spec_class):
        if "float" in str(_f.type) and _f.name not in _spec_class.nonfinite_ok:
            FLOAT_KEYS.append((_preset, _f.name))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("preset, key", FLOAT_KEYS)
def test_non_finite_numeric_parameters_are_refused(preset, key, value, tmp_path):
    from omegaconf import OmegaConf

    entry = OmegaConf.to_container(ENTRIES[preset], resolve=True)
    if preset == "steer":  # otherwise refused first for having no vector
        np.save(tmp_path / "vector.npy", np.ones(3))
        entry["file"] = str(tmp_path / "vector.npy")
    with pytest.raises(ConfigError) as err:
        build_hook(preset, {**entry, key: value})
    message = str(err.value)  # the type's own check may speak first (e.g. "hooks.clip: min (inf) > max")
    assert message.startswith(f"hooks.{preset}") and key in message and "\n" not in message


def test_every_type_with_a_float_key_is_covered():
    assert {"scale", "replace", "clamp", "post_accumulate", "shift"} <= {ENTRIES[p].type for p, _ in FLOAT_KEYS}


# -- silent entries -----------------------------------------------------------------------------
class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 3).requires_grad_(False)
        self.unused = nn.Linear(3, 3)
        self.dict_out = DictOut()
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.dict_out(self.stem(x))["a"])


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return {"a": self.fc(x)}


def test_silent_names_entry_layer_kind_and_reason(recwarn):
    model = Frozen()
    hooks = build_hooks({
        "frozen": {"type": "stats", "layers": "stem", "kinds": ["output", "grad_output"]},
        "never": {"type": "stats", "layers": "unused", "kinds": ["output"]},
        "dict": {"type": "custom", "fn": "test_custom_hooks.forty_two", "hook": "full_backward",
                 "layers": "dict_out"},
        "fine": {"type": "stats", "layers": "head", "kinds": ["output", "grad_output"]},
    })
    with HookSession(model, hooks) as session:
        session.backward(model(torch.randn(2, 3)).sum())
        silent = session.silent()
    got = {(s.key, s.layer, s.kind): s.reason for s in silent}
    assert set(got) == {("hooks.frozen", "stem", "grad_output"), ("hooks.never", "unused", "output"),
                        ("hooks.dict", "dict_out", "grad_input"), ("hooks.dict", "dict_out", "grad_output")}
    assert got[("hooks.frozen", "stem", "grad_output")].startswith("frozen parameters")
    assert got[("hooks.never", "unused", "output")].startswith("module never called")
    assert "dict output" in got[("hooks.dict", "dict_out", "grad_output")]


def test_an_edit_that_never_ran_is_silent():
    model = Frozen()
    hooks = build_hooks({"shift": {"type": "shift", "layers": "unused", "value": 1.0}})
    with HookSession(model, hooks) as session:
        model(torch.randn(2, 3))
        assert [(s.key, s.kind) for s in session.silent()] == [("hooks.shift", "input")]


def test_nothing_is_silent_when_every_kind_was_recorded():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    hooks = build_hooks({"s": {"type": "stats", "layers": "leaf:**", "kinds": ["input", "output", "grad_output"]},
                         "p": {"type": "post_accumulate", "layers": "0"}})
    with HookSession(model, hooks) as session:
        session.backward(model(torch.randn(2, 3)).sum())
        assert session.silent() == []
