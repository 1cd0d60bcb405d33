"""``index``, ``ablate``, ``patch`` and the intervention metrics, each against the same intervention
written by hand in plain PyTorch on the same model, weights and data."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from common.errors import ConfigError
import runner.analysis as analysis
from conftest import make_config, run
from hooks import HookSession, build_hooks
from hooks.mechanism.recorder import walk
from runner.config.schema import MetricConfig
from runner.engine.metrics import OutputMetrics
from runner.engine.plan import compile_plan
from runner.engine.side_by_side import clean_and_corrupted
from runner.sources.models import build_model, gpt2_tiny

RESNET = ("model=resnet18", "data.shape=[2,3,32,32]", "loss=none")
GPT = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "metric.diff=[3,4]")


def kept(run_dir, layer: str, kind: str = "output") -> torch.Tensor:
    """The one kept ``kind`` tensor of ``layer`` in step 0 of a run."""
    rows = analysis.load_tensors(run_dir)
    rows = rows[(rows.layer == layer) & (rows.kind == kind) & (rows.step == 0)]
    assert len(rows) == 1, rows
    return torch.from_numpy(rows.iloc[0].tensor)


def randn_batch(shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def tokens(seed: int, shape=(2, 16), vocab: int = 100) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# -- index -------------------------------------------------------------------------------------
def _two_layer():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))


@pytest.mark.parametrize("entry, part", [
    ({"type": "edit_output", "layers": "0", "op": "set", "value": 5.0, "index": [1, 4]}, (slice(None), [1, 4])),
    ({"type": "edit_output", "layers": "0", "op": "mul", "value": 3.0, "index": "..., 2:5"}, (Ellipsis, slice(2, 5))),
    ({"type": "ablate", "layers": "0", "op": "zero", "index": ":, 0"}, (slice(None), 0)),
])
def test_an_indexed_edit_changes_only_its_part(entry, part):
    x = randn_batch([3, 4])
    model = _two_layer()
    plain = model[0](x).detach()
    seen = {}
    model[1].register_forward_pre_hook(lambda m, args: seen.setdefault("out", args[0].detach()))
    with HookSession(model, build_hooks({"e": entry})):
        model(x)
    edited = seen["out"]
    outside = torch.ones_like(plain, dtype=torch.bool)
    outside[part] = False
    assert torch.equal(edited[outside], plain[outside])  # the rest, bit for bit
    by_hand = {"set": lambda t: torch.full_like(t, 5.0), "mul": lambda t: t * 3.0}.get(entry.get("op"),
                                                                                      torch.zeros_like)
    assert torch.equal(edited[part], by_hand(plain)[part])


def test_an_indexed_gradient_scale_changes_only_those_channels_of_the_parameter_gradient():
    x = randn_batch([3, 4])
    model = _two_layer()
    model(x).sum().backward()
    plain = model[1].weight.grad.clone()
    model.zero_grad()
    with HookSession(model, build_hooks({"s": {"type": "scale", "layers": "1", "params": ["weight"],
                                              "factor": 2.0, "index": [0, 5]}})) as session:
        session.backward(model(x).sum())
    by_hand = plain.clone()
    by_hand[:, [0, 5]] = plain[:, [0, 5]] * 2.0
    assert torch.equal(model[1].weight.grad, by_hand)


@pytest.mark.parametrize("mechanism", ["tensor", "module"])
def test_an_indexed_gradient_replacement_replaces_only_those_channels(mechanism):
    x = randn_batch([3, 4])
    model = _two_layer()
    model(x).sum().backward()
    by_hand = model[0].weight.grad.clone()
    by_hand[1] = 0.0  # grad_input of the second layer, channel 1, set to 0: nothing reaches row 1
    model.zero_grad()
    entry = {"type": "full_backward", "layers": "1", "replace": 0.0, "index": [1], "mechanism": mechanism}
    with HookSession(model, build_hooks({"f": entry})) as session:
        session.backward(model(x).sum())
    assert torch.equal(model[0].weight.grad, by_hand)


def test_an_indexed_input_shift_shifts_only_that_channel():
    x = randn_batch([3, 4])
    model = _two_layer()
    hidden = model[0](x).detach()
    hidden[:, 2] += 1.0
    by_hand = model[1](hidden)
    with HookSession(model, build_hooks({"s": {"type": "shift", "layers": "1", "index": [2]}})):
        assert torch.equal(model(x).detach(), by_hand.detach())


@pytest.mark.parametrize("index, bad", [('"..., 0:40"', "'0:40'"), ("[3,700]", "[3, 700]"),
                                         ('":, :, :, :, 0"', "5 indexed dims")])
def test_an_index_that_does_not_fit_the_planned_shape_is_one_line(index, bad):
    cfg = make_config(*RESNET, "hooks=ablate", f"hooks.ablate.index={index}")
    with pytest.raises(ConfigError) as info:
        compile_plan(cfg)
    message = str(info.value)
    assert message.startswith("hooks.ablate.index: ") and "[2, 256, 2, 2]" in message and bad in message
    assert "\n" not in message


def test_a_malformed_index_fails_when_the_entry_is_built():
    with pytest.raises(ConfigError, match=r"hooks.ablate.index: 'x' in '\.\.\., x'"):
        compile_plan(make_config(*RESNET, "hooks=ablate", 'hooks.ablate.index="..., x"'))


# -- ablate on resnet18's layer3, channels 3 and 17 ---------------------------------------------
CHANNELS = [3, 17]


def hand_ablated_output(op: str, reference: torch.Tensor | None = None) -> torch.Tensor:
    """resnet18 with a plain forward hook on layer3 doing the ablation, on the run's weights and batch."""
    torch.manual_seed(0)
    model = build_model(make_config(*RESNET).model).train()
    x = randn_batch([2, 3, 32, 32])

    def ablate(module, args, out):
        new = out.clone()
        if op == "zero":
            new[:, CHANNELS] = 0.0
        elif op == "mean":
            source = out if reference is None else reference
            new[:, CHANNELS] = source.mean(0, keepdim=True).expand_as(out)[:, CHANNELS]
        else:  # resample within a batch of 2: the only permutation without fixed points swaps them
            new[:, CHANNELS] = out[[1, 0]][:, CHANNELS]
        return new

    model.layer3.register_forward_hook(ablate)
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("op", ["zero", "mean", "resample"])
def test_ablating_channels_of_a_resnet_layer_matches_the_hand_written_hook(run_with, op):
    out = run_with(*RESNET, "hooks=[ablate,extract]", f"hooks.ablate.op={op}", "hooks.ablate.index=[3,17]",
                   "hooks.extract.layers=fc")
    assert torch.equal(kept(out, "fc"), hand_ablated_output(op))
    rows = analysis.load_stats(out)
    assert set(rows[rows.hook == "ablate"].kind) == {"output"}  # it records what it produced


def test_mean_ablation_from_a_stored_run_uses_that_runs_samples(run_with):
    reference = run_with(*RESNET, "hooks=extract", "hooks.extract.layers=layer3", "data.seed=5")
    out = run_with(*RESNET, "hooks=[ablate,extract]", "hooks.ablate.op=mean", "hooks.ablate.index=[3,17]",
                   f"hooks.ablate.reference={reference}", "hooks.extract.layers=fc")
    assert torch.equal(kept(out, "fc"), hand_ablated_output("mean", kept(reference, "layer3")))


def test_mean_ablation_of_an_input_from_a_stored_run_uses_that_runs_kept_inputs(run_with):
    """``target: input`` with a stored reference: the mean over the inputs that run kept of layer3,
    put into channels 3 and 17 of layer3's input by a hand-written forward pre-hook."""
    reference = run_with(*RESNET, "hooks=extract", "hooks.extract.layers=layer3", "hooks.extract.kinds=[input]",
                         "data.seed=5")
    out = run_with(*RESNET, "hooks=[ablate,extract]", "hooks.ablate.op=mean", "hooks.ablate.target=input",
                   "hooks.ablate.index=[3,17]", f"hooks.ablate.reference={reference}", "hooks.extract.layers=fc")
    stored = kept(reference, "layer3", kind="input")
    torch.manual_seed(0)
    model = build_model(make_config(*RESNET).model).train()

    def ablate(module, args):
        new = args[0].clone()
        new[:, CHANNELS] = stored.mean(0, keepdim=True).expand_as(new)[:, CHANNELS]
        return (new,)

    model.layer3.register_forward_pre_hook(ablate)
    with torch.no_grad():
        by_hand = model(randn_batch([2, 3, 32, 32]))
    assert not torch.equal(stored.mean(0), stored[0])  # the mean is not one of the samples
    assert torch.equal(kept(out, "fc"), by_hand)


def test_a_stored_reference_without_the_layer_or_of_another_shape_is_one_line(run_with):
    reference = run_with(*RESNET, "hooks=extract", "hooks.extract.layers=layer2")
    with pytest.raises(ConfigError, match=r"^hooks.ablate.reference: run '.*' kept no output of layer 'layer3'; "
                                          r"it kept the output of: layer2$"):
        compile_plan(make_config(*RESNET, "hooks=ablate", "hooks.ablate.op=mean", f"hooks.ablate.reference={reference}"))
    with pytest.raises(ConfigError, match=r"^hooks.ablate.reference: .* kept 'layer2' outputs of shape \[128, 4, 4\] "
                                          r"per sample; this run's are \[128, 8, 8\]$"):
        compile_plan(make_config("model=resnet18", "data.shape=[2,3,64,64]", "loss=none", "hooks=ablate",
                                 "hooks.ablate.layers=layer2", "hooks.ablate.op=mean",
                                 f"hooks.ablate.reference={reference}"))


# -- patch on gpt2_tiny ----------------------------------------------------------------------------
def hand_patched_logits(layer: int, position: int | None,
                        n_layer: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clean, corrupted and patched logits of gpt2_tiny (``n_layer`` blocks), by a plain loop: the clean
    block output is captured, then put into the corrupted pass (all positions, or one)."""
    torch.manual_seed(0)
    model = gpt2_tiny(n_layer=n_layer).eval()
    block = model.transformer.h[layer]
    with torch.no_grad():
        saved = {}
        handle = block.register_forward_hook(lambda m, a, out: saved.setdefault("clean", out))
        clean = model(tokens(0)).logits
        handle.remove()
        corrupted = model(tokens(1)).logits

        def patch(module, args, out):
            new = out.clone()
            where = (slice(None), slice(None)) if position is None else (slice(None), position)
            new[where] = saved["clean"][where]
            return new

        block.register_forward_hook(patch)
        patched = model(tokens(1)).logits
    return clean, corrupted, patched


def logit_diff(logits: torch.Tensor) -> float:
    last = logits[:, -1].double()
    return float((last[:, 3] - last[:, 4]).mean())


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """A clean run keeping every block's output and the logits: the patching tests' source, which they only read."""
    overrides = (*GPT, "hooks=extract", r"hooks.extract.layers=[re:transformer\.h\.\d+,lm_head]")
    return run(make_config(*overrides), tmp_path_factory.mktemp("clean") / "run", overrides)


def test_patching_the_last_block_from_a_stored_clean_run_gives_the_clean_output(run_with, clean_run):
    out = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", f"hooks.patch.source={clean_run}",
                   "hooks.patch.layers=transformer.h.1", "hooks.extract.layers=lm_head")
    assert torch.equal(kept(out, "lm_head"), kept(clean_run, "lm_head"))
    clean, corrupted, patched = hand_patched_logits(1, None)
    assert torch.equal(kept(out, "lm_head"), patched) and not torch.equal(clean, corrupted)
    rows = analysis.load_stats(out)
    assert len(rows[(rows.hook == "patch") & (rows.kind == "patched")]) == 1  # what was put in is recorded


def test_patching_one_position_recovers_the_metric_as_the_hand_written_loop(run_with, clean_run):
    corrupted_run = run_with(*GPT, "data.seed=1")
    out = run_with(*GPT, "data.seed=1", "hooks=patch", f"hooks.patch.source={clean_run}",
                   "hooks.patch.layers=transformer.h.0", "hooks.patch.index=15")
    clean, corrupted, patched = hand_patched_logits(0, 15)
    metric = {run: float(analysis.load_steps(run).logit_diff.iloc[0]) for run in (clean_run, corrupted_run, out)}
    assert metric[clean_run] == pytest.approx(logit_diff(clean), abs=1e-6)
    assert metric[corrupted_run] == pytest.approx(logit_diff(corrupted), abs=1e-6)
    assert metric[out] == pytest.approx(logit_diff(patched), abs=1e-6)
    by_hand = (logit_diff(patched) - logit_diff(corrupted)) / (logit_diff(clean) - logit_diff(corrupted))
    got = (metric[out] - metric[corrupted_run]) / (metric[clean_run] - metric[corrupted_run])
    assert got == pytest.approx(by_hand, rel=1e-4) and not got == pytest.approx(0.0, abs=1e-3)


def test_a_patch_source_that_lacks_the_layer_step_or_shape_fails_before_the_run(run_with, clean_run, tmp_path):
    with pytest.raises(ConfigError, match=r"^hooks.patch.source: run '.*' kept no output of layer "
                                          r"'transformer.h.0.mlp'; it kept the output of: lm_head, "):
        compile_plan(make_config(*GPT, "hooks=patch", f"hooks.patch.source={clean_run}",
                                 "hooks.patch.layers=transformer.h.0.mlp"))
    with pytest.raises(ConfigError, match=r"^hooks.patch.source_step: run '.*' has no step 1 \(it kept steps \[0\]\)"):
        compile_plan(make_config(*GPT, "steps=2", "hooks=patch", f"hooks.patch.source={clean_run}",
                                 "hooks.patch.layers=transformer.h.0"))
    # gpt2_tiny cannot run on the meta device (its mask code calls .item()): the shape is checked at
    # the first call, and the failed run leaves no file behind
    with pytest.raises(ConfigError, match=r"^hooks.patch.source: .* kept 'transformer.h.0' outputs of shape "
                                          r"\[2, 16, 32\]; this run's are \[2, 8, 32\]$"):
        run_with(*GPT, "data.shape=[2,8]", "hooks=patch", f"hooks.patch.source={clean_run}",
                 "hooks.patch.layers=transformer.h.0")
    assert not (tmp_path / "run0" / "manifest.json").exists()
    with pytest.raises(ConfigError, match=r"^hooks.patch.source: '.*nowhere' is not a complete run directory"):
        compile_plan(make_config(*GPT, "hooks=patch", f"hooks.patch.source={tmp_path / 'nowhere'}"))


# -- patch from the run's own clean pass (source: clean) -------------------------------------------
@pytest.mark.parametrize("layer, position", [(1, None), (0, 15)], ids=["last-block-whole", "first-block-one-position"])
def test_patching_from_the_runs_own_clean_pass_matches_the_hand_written_loop(run_with, layer, position):
    """Clean tokens (seed 0) and corrupted ones (``data.seed=1``) side by side in one run: the
    patched output and the three metrics of each step are those of the hand-written loop."""
    index = [] if position is None else [f"hooks.patch.index={position}"]
    out = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", "hooks.patch.source=clean",
                   f"hooks.patch.layers=transformer.h.{layer}", *index, "hooks.extract.layers=lm_head")
    clean, corrupted, patched = hand_patched_logits(layer, position)
    assert torch.equal(kept(out, "lm_head"), patched) and not torch.equal(clean, corrupted)
    step = analysis.load_steps(out).iloc[0]
    assert step.logit_diff == pytest.approx(logit_diff(patched), abs=1e-6)
    assert step.clean_logit_diff == pytest.approx(logit_diff(clean), abs=1e-6)
    assert step.corrupted_logit_diff == pytest.approx(logit_diff(corrupted), abs=1e-6)
    if position is None:  # the last block whole: the clean output itself
        assert torch.equal(kept(out, "lm_head"), clean) and step.logit_diff == step.clean_logit_diff
    rows = analysis.load_stats(out)
    assert len(rows[(rows.hook == "patch") & (rows.kind == "patched")]) == 1
    assert set(rows.call) == {0} and set(rows.phase) == {"forward"}  # the side passes left no row


def test_the_clean_pass_gives_what_a_stored_clean_run_gives(run_with, clean_run):
    stored = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", f"hooks.patch.source={clean_run}",
                      "hooks.patch.layers=transformer.h.0", "hooks.patch.index=7", "hooks.extract.layers=lm_head")
    own = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", "hooks.patch.source=clean",
                   "hooks.patch.layers=transformer.h.0", "hooks.patch.index=7", "hooks.extract.layers=lm_head")
    assert torch.equal(kept(own, "lm_head"), kept(stored, "lm_head"))


def test_the_side_passes_leave_a_training_model_as_they_found_it():
    """BatchNorm in train mode updates its running statistics in every forward: the clean and
    corrupted passes restore them, compute no gradient and keep the clean output of the layer."""
    torch.manual_seed(0)
    model = build_model(make_config(*RESNET).model).train()
    (entry,) = build_hooks({"p": {"type": "patch", "layers": "layer3", "source": "clean"}})
    clean, corrupted = randn_batch([2, 3, 32, 32], 0), randn_batch([2, 3, 32, 32], 1)
    before = {name: b.clone() for name, b in model.named_buffers()}
    with HookSession(model, [entry]) as session, OutputMetrics(model, MetricConfig(target=1)) as measures:
        beside = clean_and_corrupted(model, model, clean, corrupted, [entry], session.recorder, measures)
        assert session.recorder.drain().columns["layer"] == []  # nothing recorded
    assert all(torch.equal(b, before[name]) for name, b in model.named_buffers())
    assert all(p.grad is None for p in model.parameters())
    kept_clean = {}
    handle = model.layer3.register_forward_hook(lambda m, a, out: kept_clean.setdefault("out", out.detach().clone()))
    with torch.no_grad():
        logits = model(clean)
    handle.remove()
    assert torch.equal(entry._source[(0, "layer3", 0, "0")], kept_clean["out"])
    assert beside["clean_logit"] == pytest.approx(float(logits[:, 1].double().mean()), abs=1e-9)
    assert set(beside) == {"clean_logit", "corrupted_logit"}


def test_in_train_mode_the_clean_pass_meets_the_dropout_masks_of_the_patched_step():
    """gpt2_tiny drops 10% of its activations in train mode. Patched whole, block 0 hands the clean
    pass's value on, so the patched step's logits are the clean pass's only if the blocks after it
    drew the same masks in both; the unpatched corrupted pass is the step a run without the patch
    would take; and the randomness after the side passes is what it was before them."""
    torch.manual_seed(0)
    model = gpt2_tiny().train()
    (entry,) = build_hooks({"p": {"type": "patch", "layers": "transformer.h.0", "source": "clean"}})
    clean, corrupted = tokens(0), tokens(1)
    metric = MetricConfig(diff=[3, 4])
    torch.manual_seed(5)
    with torch.no_grad():
        unpatched = model(corrupted).logits
    with HookSession(model, [entry]) as session, OutputMetrics(model, metric) as measures:
        torch.manual_seed(5)
        before = torch.get_rng_state()
        beside = clean_and_corrupted(model, model, clean, corrupted, [entry], session.recorder, measures)
        assert torch.equal(torch.get_rng_state(), before)
        with torch.no_grad():
            model(corrupted)
        patched_diff = measures.take()["logit_diff"]
    assert patched_diff == beside["clean_logit_diff"]
    assert beside["corrupted_logit_diff"] == pytest.approx(logit_diff(unpatched), abs=1e-6)
    torch.manual_seed(6)  # other masks: another value, so the equalities above were the masks'
    with torch.no_grad():
        assert not torch.equal(model(corrupted).logits, unpatched)
    assert patched_diff != beside["corrupted_logit_diff"]


@pytest.mark.parametrize("overrides, message", [
    (["hooks.patch.source=clean", "+hooks.patch.clean.seedd=0"], r"^hooks.patch.clean.seedd: .*did you mean 'seed'"),
    (["hooks.patch.source=clean", "+hooks.patch.clean.shape=[2,8]"],
     r"^hooks.patch.clean: the clean batch is torch.int64 \[2, 8\], the run's batch torch.int64 \[2, 16\]"),
    (["hooks.patch.source=clean", "hooks.patch.source_step=0"], r"^hooks.patch.source_step: a clean pass runs"),
    (["hooks.patch.source=clean", "hooks.patch.clean=3"], r"^hooks.patch.clean: 3 must be a mapping"),
])
def test_a_bad_clean_source_is_one_line_before_the_run(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        compile_plan(make_config(*GPT, "data.seed=1", "hooks=patch", "hooks.patch.layers=transformer.h.0", *overrides))
    assert "\n" not in str(info.value)


# -- outputs with several tensors (slot) -------------------------------------------------------------
def test_patching_an_attention_output_returned_in_a_tuple_matches_the_hand_written_loop(run_with):
    """GPT-2's attention returns ``(attn_output, None)``: its one tensor is what gets patched (from
    the run's own clean pass, one position), and the logits are those of the hand-written loop."""
    out = run_with(*GPT, "data.seed=1", "hooks=[patch,extract]", "hooks.patch.source=clean",
                   "hooks.patch.layers=transformer.h.1.attn", "hooks.patch.index=15", "hooks.extract.layers=lm_head")
    torch.manual_seed(0)
    model = gpt2_tiny().eval()
    attn = model.transformer.h[1].attn
    with torch.no_grad():
        saved = {}
        handle = attn.register_forward_hook(lambda m, a, out: saved.update(clean=out[0]))
        clean = model(tokens(0)).logits
        handle.remove()
        corrupted = model(tokens(1)).logits

        def patch(module, args, out):
            new = out[0].clone()
            new[:, 15] = saved["clean"][:, 15]
            return (new, *out[1:])

        attn.register_forward_hook(patch)
        patched = model(tokens(1)).logits
    assert torch.equal(kept(out, "lm_head"), patched) and not torch.equal(patched, corrupted)
    step = analysis.load_steps(out).iloc[0]
    assert step.clean_logit_diff == pytest.approx(logit_diff(clean), abs=1e-6)
    assert step.logit_diff == pytest.approx(logit_diff(patched), abs=1e-6)
    rows = analysis.load_stats(out)
    assert list(rows[(rows.hook == "patch") & (rows.kind == "patched")].slot) == ["0"]


@pytest.mark.parametrize("slot, name", [(0, "0"), (1.0, "1.0"), ("1.1", "1.1")])
def test_ablating_one_tensor_of_an_lstm_output_changes_that_tensor_only(slot, name):
    """``nn.LSTM`` returns ``(output, (h_n, c_n))``: ``slot`` picks the tensor (as the command line
    gives it: a number or a string), the others are bit for bit those of the plain module."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 3, batch_first=True)
    x = randn_batch([2, 5, 4])
    with torch.no_grad():
        plain = lstm(x)
    (entry,) = build_hooks({"a": {"type": "ablate", "layers": "", "slot": slot, "index": ":, 1"}})
    with HookSession(lstm, [entry]), torch.no_grad():
        out = lstm(x)
    assert type(out) is tuple and type(out[1]) is tuple
    before = {"0": plain[0], "1.0": plain[1][0], "1.1": plain[1][1]}
    after = {"0": out[0], "1.0": out[1][0], "1.1": out[1][1]}
    for where, tensor in after.items():
        want = before[where].clone()
        if where == name:
            want[:, 1] = 0  # what a hand-written hook zeroing [:, 1] of this one tensor gives
        assert torch.equal(tensor, want), where


def test_ablating_the_second_input_of_a_two_input_module():
    torch.manual_seed(0)
    bilinear = torch.nn.Bilinear(3, 4, 2)
    x1, x2 = randn_batch([5, 3], 0), randn_batch([5, 4], 1)
    (entry,) = build_hooks({"a": {"type": "ablate", "layers": "", "target": "input", "slot": 1}})
    with HookSession(bilinear, [entry]), torch.no_grad():
        out = bilinear(x1, x2)
    with torch.no_grad():
        assert torch.equal(out, bilinear(x1, torch.zeros_like(x2)))


def test_an_output_edit_puts_the_tensor_back_into_named_tuples_lists_and_mappings():
    """The container comes back of the type it was, with the one tensor replaced and the rest
    the very objects they were (a ``transformers`` ModelOutput, too)."""
    from collections import namedtuple

    from transformers.modeling_outputs import BaseModelOutput

    Pair = namedtuple("Pair", "a b")
    a, b, c = torch.ones(2), torch.zeros(2), torch.full((2,), 3.0)
    outputs = {
        "named tuple": (Pair(a, [b, c]), "1.1", lambda o: o.b[1]),
        "mapping": ({"x": a, "y": (b, c)}, "y.0", lambda o: o["y"][0]),
        "ModelOutput": (BaseModelOutput(last_hidden_state=a, hidden_states=(b, c)), "hidden_states.1",
                        lambda o: o.hidden_states[1]),
        "beside a structseq": ((a, torch.max(torch.eye(2), 0)), "0", lambda o: o[0]),
    }
    for label, (output, slot, pick) in outputs.items():
        module = torch.nn.Module()
        module.forward = lambda output=output: output
        (entry,) = build_hooks({"e": {"type": "edit_output", "layers": "", "op": "set", "value": 7.0, "slot": slot}})
        with HookSession(module, [entry]):
            new = module()
        assert type(new) is type(output), label
        assert torch.equal(pick(new), torch.full((2,), 7.0)), label
        assert [s for s, _ in walk(new)] == [s for s, _ in walk(output)], label
        assert all(t is dict(walk(output))[s] for s, t in walk(new) if s != slot), label
    # containers off the way to the slot are not rebuilt: the very objects they were
    output = (a, torch.max(torch.eye(2), 0))
    module = torch.nn.Module()
    module.forward = lambda: output
    (entry,) = build_hooks({"e": {"type": "edit_output", "layers": "", "op": "set", "value": 7.0, "slot": 0}})
    with HookSession(module, [entry]):
        assert module()[1] is output[1]


# -- metrics ---------------------------------------------------------------------------------------
def test_logit_and_logit_diff_of_a_classifier_are_the_batch_means_by_hand(run_with):
    out = run_with("model=convnet", "data.shape=[4,3,8,8]", "loss=cross_entropy", "metric.target=2",
                   "metric.diff=[1,4]", "hooks=extract", "hooks.extract.layers=fc")
    logits = kept(out, "fc").double()
    steps = analysis.load_steps(out)
    assert steps.logit.iloc[0] == pytest.approx(float(logits[:, 2].mean()), abs=1e-9)
    assert steps.logit_diff.iloc[0] == pytest.approx(float((logits[:, 1] - logits[:, 4]).mean()), abs=1e-9)
    assert np.isfinite(steps.accuracy.iloc[0])


def test_a_metric_class_the_model_does_not_have_is_one_line():
    with pytest.raises(ConfigError, match=r"^metric.target: 7 is not a class of a model with num_classes=5"):
        compile_plan(make_config("model=convnet", "metric.target=7"))
    with pytest.raises(ConfigError, match=r"^metric.diff: \[1\] must be two classes"):
        compile_plan(make_config("model=convnet", "metric.diff=[1]"))


def test_patching_whole_resnet_layers_from_a_clean_run_gives_its_output_at_every_layer(run_with):
    """A resnet's stages are sequential: patching all of any one of them restores the clean output."""
    clean = run_with(*RESNET, "hooks=extract", "hooks.extract.layers=[layer1,layer2,layer3,layer4,fc]")
    for layer in ("layer1", "layer4"):
        out = run_with(*RESNET, "data.seed=1", "hooks=[patch,extract]", f"hooks.patch.source={clean}",
                       f"hooks.patch.layers={layer}", "hooks.extract.layers=fc")
        assert torch.equal(kept(out, "fc"), kept(clean, "fc"))
    assert not torch.equal(kept(run_with(*RESNET, "data.seed=1", "hooks=extract", "hooks.extract.layers=fc"), "fc"),
                           kept(clean, "fc"))


def test_a_patch_entry_whose_module_never_ran_is_reported_silent(run_with):
    source = run_with("model=convnet", "hooks=extract", "hooks.extract.layers=fc")
    torch.manual_seed(0)
    model = build_model(make_config("model=convnet").model)
    (entry,) = build_hooks({"p": {"type": "patch", "layers": "fc", "source": str(source)}})
    with HookSession(model, [entry]) as session:
        model.conv(randn_batch([1, 3, 8, 8]))  # fc is never called: nothing is patched
        silent = {(s.key, s.layer, s.kind) for s in session.silent()}
    assert silent == {("hooks.p", "fc", "output"), ("hooks.p", "fc", "patched")}
