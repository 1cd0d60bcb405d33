"""A run leaves the model as it found it, and what it captured cannot be changed or leak memory.

The leak matrix runs every hook preset (and so every registered hook type, see
``test_every_hook_type_has_a_preset``) on success, an exception in the model, an exception inside
a hook and Ctrl-C; the ``watch`` fixture then compares every hook dict of every module and
parameter, and the global ones, with a snapshot taken when the model was built.
"""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import assert_no_partial_output, make_config, run, seeded_batch
from hooks import HookSession, build_hooks
from hooks.mechanism.recorder import Recorder
from hooks.mechanism.registry import HOOK_TYPES
from sae_folders import random_saelens
from transcoder_folders import saelens_transcoder
from runner.analysis import load as analysis

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "hooks").glob("*.yaml"))
SMALL_RESNET = ("model=resnet18", "data.shape=[2,3,32,32]")
MINI_RESNET = ("model=custom", "model._target_=models_for_tests.MiniResNet", "model.head=fc", "data.shape=[2,3,8,8]")
#: The residual preset adds the input to the output of the model itself (the tutorial's Linear);
#: on a resnet it needs a module whose output has its input's shape.
SHAPE_KEEPING = {"residual": ("hooks.residual.layers=relu",)}
#: ``ablate``, ``patch`` and ``attribution`` default to ``layer3``, which the mini resnet lacks; ``patch`` also
#: needs a source run, ``attribution`` a metric to differentiate.
INTERVENTION_LAYERS = {"ablate": ("hooks.ablate.layers=layer4",), "patch": ("hooks.patch.layers=layer4",),
                       "attribution": ("hooks.attribution.layers=layer4", "metric.diff=[0,1]")}
#: ``store`` defaults to ``layer3`` too, and needs a directory to write its shards to.
STORE_PRESET = ("hooks.store.layers=layer4",)
#: ``steer`` defaults to ``layer3`` too, and needs a vector of layer4's 4 channels.
STEER_PRESET = ("hooks.steer.layers=layer4",)
#: ``logit_lens`` and ``dla`` read a causal language model; its last module, where the model fails, is ``lm_head``.
GPT2 = ("model=gpt2_tiny", "data=tokens")
#: ``graph`` reads the transcoders a ``transcoder`` entry splices at every block's MLP: the tutorial's random ones.
GRAPH = ("hooks=[transcoder,graph]", "model=gpt2_tiny", "model.vocab_size=61", "data=tokens", "mode=eval", "loss=none",
         f"hooks.transcoder.path={Path(__file__).resolve().parent / 'fixtures' / 'transcoders_gpt2_tiny'}")


def _raise(error: type[BaseException]):
    def fail(*args, **kwargs):
        raise error("injected fault")

    return fail


def _fail_in_model(error: type[BaseException]):
    def prepare(model: nn.Module) -> None:
        last = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.fc
        last.forward = _raise(error)  # the last layer: every earlier hook has fired

    return prepare


SCENARIOS = {
    "success": None,
    "exception-in-model": (RuntimeError, _fail_in_model(RuntimeError), None),
    "exception-in-hook": (RuntimeError, None, _raise(RuntimeError)),
    "ctrl-c": (KeyboardInterrupt, _fail_in_model(KeyboardInterrupt), None),
}


@pytest.mark.parametrize("preset, scenario", [(p, s) for p in PRESETS for s in SCENARIOS
                                              if not (p == "none" and s == "exception-in-hook")])  # no hook to fail
def test_every_preset_leaves_every_hook_dict_as_it_was(tmp_path, watch, monkeypatch, preset, scenario):
    extra = (*SHAPE_KEEPING.get(preset, ()), *INTERVENTION_LAYERS.get(preset, ()))
    if preset == "patch":  # its source: a run of the same model that kept layer4's output (hooks=extract)
        extra += (f"hooks.patch.source={run(make_config('hooks=extract', *MINI_RESNET), tmp_path / 'source')}",)
        watch.models.clear()  # the source run's model is not the one under test
    if preset == "store":
        extra += (*STORE_PRESET, f"hooks.store.path={tmp_path / 'store'}")
    if preset == "sae":  # an SAE reading the 4 channels of layer4's last module
        extra += ("hooks.sae.layers=layer4.1", f"hooks.sae.path={random_saelens(tmp_path / 'sae', 4)}")
    if preset == "transcoder":  # a transcoder reading layer4's last module's 4 input channels, writing its 4 output ones
        extra += ("hooks.transcoder.layers=layer4.1",
                  f"hooks.transcoder.path={saelens_transcoder(tmp_path / 'transcoder', 4, 4)}")
    if preset == "steer":
        np.save(tmp_path / "vector.npy", np.ones(4))
        extra += (*STEER_PRESET, f"hooks.steer.file={tmp_path / 'vector.npy'}")
    if preset == "dla":  # the two tokens, and no dropout to make the parts not add up
        extra += ("hooks.dla.diff=[1,2]", "mode=eval", "loss=none")
    cfg = make_config(*GRAPH) if preset == "graph" else make_config(
        f"hooks={preset}", *(GPT2 if preset in ("logit_lens", "dla") else MINI_RESNET), *extra)
    out = tmp_path / "out"
    if SCENARIOS[scenario] is None:
        run(cfg, out)
        assert (out / "manifest.json").is_file()
    else:
        error, prepare, record = SCENARIOS[scenario]
        if prepare:
            watch.prepare = prepare
        if record:  # the hook's own work fails: ``units``, ``store`` and ``logit_lens`` keep their totals, not the recorder
            own = preset in ("units", "store", "logit_lens", "dla", "graph")
            monkeypatch.setattr(HOOK_TYPES.get(preset).build if own else Recorder, "take" if own else "record", record)
        with pytest.raises(error, match="injected fault"):
            run(cfg, out)
        assert_no_partial_output(out)
    (model, _), = watch.models
    watch.assert_untouched()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("observer_type", ["stats", "capture", "print"])
def test_observers_change_neither_outputs_nor_gradients_whatever_their_code_returns(monkeypatch, observer_type):
    """Every observer callback's result is dropped: here ``Recorder.record`` returns a tensor, as a
    careless helper might, and outputs and gradients stay bit-identical to an unhooked model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    reference = model(x)
    reference.sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    record = Recorder.record

    def record_and_return(self, tensor, **kw):
        record(self, tensor, **kw)
        return torch.full_like(tensor, 1000.0)

    monkeypatch.setattr(Recorder, "record", record_and_return)
    entry = {"type": observer_type, "layers": "**"}
    if observer_type != "print":
        entry["kinds"] = ["input", "output", "grad_output"]
    with HookSession(model, build_hooks({"o": entry})) as session:
        out = model(x)
        out.sum().backward()
        captures = session.recorder.drain()
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    for p, want in zip(model.parameters(), want_grads):
        torch.testing.assert_close(p.grad, want, rtol=0, atol=0)
    assert len(captures) >= 4  # it did record


def test_capture_is_not_changed_by_a_later_inplace_relu(run_with, watch):
    """torchvision's resnet applies ReLU(inplace=True) to bn1's output right after it is captured."""
    out = run_with(*SMALL_RESNET, "hooks=extract", "hooks.extract.layers=[bn1]")
    (model, _), = watch.models
    assert model.relu.inplace
    want = []
    oracle = model.bn1.register_forward_hook(lambda m, a, o: want.append(o.detach().clone()))
    model.train()  # as the run: batch statistics
    model(seeded_batch([2, 3, 32, 32]))
    oracle.remove()
    (got,) = analysis.load_tensors(out).tensor
    assert got.min() < 0  # a capture that aliased the output would have been ReLU'd to >= 0
    torch.testing.assert_close(torch.from_numpy(got), want[0])


def test_captures_hold_no_graph_and_own_their_memory():
    """Nothing captured keeps a grad_fn: the activations saved for backward are freed with the graph."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
    saved = []
    model[1].register_forward_hook(lambda m, a, o: saved.append(weakref.ref(o)))
    hooks = build_hooks({"keep": {"type": "capture", "layers": "**", "kinds": ["input", "output"]}})
    gc.disable()
    try:
        with HookSession(model, hooks) as session:
            out = model(torch.randn(32, 64, requires_grad=True))
            captures = session.recorder.drain()
        assert saved[0]() is not None  # alive while the graph is
        del out
        assert saved[0]() is None  # freed by reference counting alone: no capture holds the graph
    finally:
        gc.enable()
    assert captures.kept and all(t.grad_fn is None and not t.requires_grad for t in captures.kept)
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in captures.kept)
    assert len(model._forward_hooks) == 0 and len(model[1]._forward_hooks) == 1
