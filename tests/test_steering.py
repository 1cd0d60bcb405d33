"""``steer`` against plain PyTorch: the output a hand-written forward hook adding ``scale * vector`` gives,
the vector as the float64 mean difference of two stored runs' outputs, and the next-token distribution
steered and unsteered (``steer.parquet``) as the hand-written forward passes give it."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torchvision

import runner
from common.errors import ConfigError
from conftest import cli, make_config, run
from hooks.mechanism.registry import build_hook
from runner.analysis import load_steps, load_tensors
from runner.analysis.steering import steering_table
from runner.engine.plan import compile_plan
from runner.sources.models import gpt2_tiny

GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval")
LAYER = "transformer.h.1"


def gpt2():
    torch.manual_seed(0)
    return gpt2_tiny().eval()


def small_resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


def add_at(scale: float, vector: torch.Tensor, axis: int, parts=None):
    """The hand-written hook: ``output + scale * vector`` along ``axis`` (only in ``parts``, when given)."""
    def hook(module, args, output):
        shape = [1] * output.dim()
        shape[axis] = len(vector)
        steered = output + (scale * vector).to(output.dtype).view(shape)
        if parts is None:
            return steered
        out = output.clone()
        out[parts] = steered[parts]
        return out
    return hook


CASES = {  # model, input, layer, unit axis, index and its parts
    "gpt2_tiny": (gpt2, lambda: torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1)),
                  LAYER, 2, ":, 3:6", (slice(None), slice(3, 6))),
    "resnet18": (small_resnet, lambda: torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
                 "layer2", 1, None, None),
}


@pytest.mark.parametrize("case", CASES)
def test_steered_output_equals_a_hand_written_hook_adding_scale_times_the_vector(tmp_path, case):
    build, make_input, layer, axis, index, parts = CASES[case]
    model, x = build(), make_input()
    width = {"gpt2_tiny": 32, "resnet18": 128}[case]
    vector = np.random.default_rng(2).standard_normal(width)
    np.save(tmp_path / "v.npy", vector)
    entry = {"type": "steer", "layers": layer, "scale": 2.5, "file": str(tmp_path / "v.npy"), "baseline": False,
             **({"index": index} if index else {})}
    with runner.attach(model, hooks={"steer": entry}, out_dir=tmp_path / "run") as attached:
        with torch.no_grad():
            steered = model(x)
        attached.step()
    handle = model.get_submodule(layer).register_forward_hook(add_at(2.5, torch.from_numpy(vector), axis, parts))
    with torch.no_grad():
        by_hand = model(x)
        handle.remove()
        plain = model(x)
    logits = (lambda out: out.logits) if case == "gpt2_tiny" else (lambda out: out)
    assert torch.equal(logits(steered), logits(by_hand))
    assert not torch.equal(logits(steered), logits(plain))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Two runs that kept ``transformer.h.1``'s outputs over two steps, on different token batches."""
    root = tmp_path_factory.mktemp("steer_runs")
    return {name: run(make_config(*GPT2, "hooks=extract", f"hooks.extract.layers={LAYER}", "steps=2",
                                  f"data.seed={seed}"), root / name) for name, seed in (("pos", 1), ("neg", 2))}


def hand_mean(path) -> np.ndarray:
    kept = load_tensors(path)
    rows = np.concatenate([t.astype(np.float64).reshape(-1, t.shape[-1]) for t in kept["tensor"]])
    return rows.mean(axis=0)


def test_the_vector_is_the_float64_mean_difference_of_the_stored_outputs(stored):
    entry = build_hook("steer", {"type": "steer", "layers": LAYER, "positive": str(stored["pos"]),
                                 "negative": str(stored["neg"])})
    vector = entry.vector(LAYER, "0")
    assert vector.dtype == torch.float64
    np.testing.assert_allclose(vector.numpy(), hand_mean(stored["pos"]) - hand_mean(stored["neg"]), rtol=1e-12)


def model_calls(overrides: tuple[str, ...], out_dir) -> int:
    """How many times the run of ``overrides`` calls the whole model (a global forward hook counting the
    calls of the top module's type); the run's directory is ``out_dir``."""
    calls = []
    counting = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: calls.append(type(module).__name__ == "GPT2LMHeadModel"))
    try:
        run(make_config(*overrides), out_dir, overrides)
    finally:
        counting.remove()
    return sum(calls)


def test_kl_and_top_tokens_are_the_hand_written_steered_and_unsteered_passes(stored, tmp_path):
    """The steered and unsteered distributions and metrics of each step are those of a hand-written hook and a
    plain forward, and the unsteered one costs one forward per step: the model runs once more per step than
    in the same run without the entry."""
    overrides = (*GPT2, "hooks=steer", f"hooks.steer.layers={LAYER}", f"hooks.steer.positive={stored['pos']}",
                 f"hooks.steer.negative={stored['neg']}", "hooks.steer.scale=8", "hooks.steer.top_k=3",
                 "metric.diff=[1,2]", "steps=2")
    out = tmp_path / "steer"
    assert model_calls(overrides, out) - model_calls((*GPT2, "metric.diff=[1,2]", "steps=2"), tmp_path / "plain") == 2
    batches = compile_plan(make_config(*overrides)).data.batches(0, torch.device("cpu"))
    vector = torch.from_numpy(hand_mean(stored["pos"]) - hand_mean(stored["neg"]))
    model = gpt2()
    rows = pq.read_table(out / "steer.parquet").to_pandas()
    steps = load_steps(out)
    for step in (0, 1):
        x = next(batches).x
        with torch.no_grad():
            plain = model(x).logits[:, -1].double().log_softmax(-1)
            handle = model.get_submodule(LAYER).register_forward_hook(add_at(8.0, vector, 2))
            logits = model(x).logits[:, -1]
            handle.remove()
        steered = logits.double().log_softmax(-1)
        mine = rows[rows.step == step].sort_values("sample")
        kl = (plain.exp() * (plain - steered)).sum(-1)
        np.testing.assert_allclose(mine.kl, kl.numpy(), rtol=1e-6, atol=1e-12)
        assert [list(ids) for ids in mine.steered_top_ids] == steered.topk(3).indices.tolist()
        assert [list(ids) for ids in mine.unsteered_top_ids] == plain.topk(3).indices.tolist()
        np.testing.assert_allclose(np.stack(mine.steered_top_probs), steered.topk(3).values.exp().numpy(), rtol=1e-6)
        row = steps[(steps.step == step) & (steps.split == "train")].iloc[0]
        assert row.logit_diff == pytest.approx(float((logits[:, 1] - logits[:, 2]).double().mean()), rel=1e-6)
        unsteered = model(x).logits[:, -1].detach()
        assert row.corrupted_logit_diff == pytest.approx(float((unsteered[:, 1] - unsteered[:, 2]).double().mean()),
                                                         rel=1e-6)
        assert "clean_logit_diff" not in steps  # no clean pass ran
    assert set(rows.method) == {"steer"} and (rows.kl > 0).all()
    table = steering_table(out)
    assert table.loc[0, "method"] == "steer" and table.loc[0, "kl"] == pytest.approx(rows.kl.mean())


def test_steering_jobs_are_rows_of_the_one_methods_table_with_their_steer_parquet_values(stored, tmp_path):
    """Three steering jobs (one at positions 14 and 15) beside a patching job: ``patching_table`` gives a ``steer``
    row per job whose ``kl`` is the mean of its ``steer.parquet`` and whose ``patched`` and ``corrupted`` are its
    steps' metric and unsteered metric; the heatmap draws the steering rows as layer x scale."""
    from runner.analysis.patching import patching_table
    from runner.analysis.patching_plots import patching_heatmap

    vector = ("metric.diff=[1,2]", "steps=2", "hooks=steer", f"hooks.steer.layers={LAYER}",
              f"hooks.steer.positive={stored['pos']}", f"hooks.steer.negative={stored['neg']}")
    jobs = {(0.0, "all"): ("hooks.steer.scale=0",), (8.0, "all"): ("hooks.steer.scale=8",),
            (8.0, ":, 14:16"): ("hooks.steer.scale=8", "hooks.steer.index=':, 14:16'")}
    for i, extra in enumerate(jobs.values()):
        overrides = (*GPT2, *vector, *extra)
        run(make_config(*overrides), tmp_path / "methods" / f"steer{i}", overrides)
    overrides = (*GPT2, "metric.diff=[1,2]", "data.seed=1", "hooks=patch", "hooks.patch.source=clean",
                 "hooks.patch.layers=transformer.h.0", "hooks.patch.index=15")
    run(make_config(*overrides), tmp_path / "methods" / "patch", overrides)
    table = patching_table(tmp_path / "methods", metric="logit_diff")
    assert table.groupby("method").size().to_dict() == {"patch": 1, "steer": 3}
    assert table[table.method == "patch"][["scale", "kl"]].isna().all().all()
    steer = table[table.method == "steer"]
    assert (steer.layer == LAYER).all() and steer.clean.isna().all() and steer.recovered.isna().all()
    assert sorted(zip(steer.scale, steer["index"])) == sorted(jobs)
    for i, (scale, index) in enumerate(jobs):
        row = steer[(steer.scale == scale) & (steer["index"] == index)].iloc[0]
        kl = pq.read_table(tmp_path / "methods" / f"steer{i}" / "steer.parquet").column("kl").to_numpy()
        steps = pq.read_table(tmp_path / "methods" / f"steer{i}" / "steps.parquet").to_pandas()
        steps = steps[steps.split == "train"]
        assert len(kl) == 4 and row.kl == pytest.approx(kl.mean(), rel=1e-12)
        assert row.patched == pytest.approx(steps.logit_diff.mean(), rel=1e-12)
        assert row.corrupted == pytest.approx(steps.corrupted_logit_diff.mean(), rel=1e-12)
        assert (row.patched == row.corrupted) == (scale == 0)
    figure = patching_heatmap(table)
    titles = [ax.get_title() for ax in figure.axes]
    assert {"steering: change of logit_diff", "activation patching: recovered fraction of logit_diff"} <= set(titles)


@pytest.mark.parametrize("bad, message", [
    (("hooks.steer.positive=/no/such/run", "hooks.steer.negative=/no/such/run"),
     "error: hooks.steer.positive: '/no/such/run' is not a complete run directory (no manifest.json)"),
    (("hooks.steer.file=VECTOR",),
     f"error: hooks.steer.file: the file 'VECTOR' is a vector of 7 units; '{LAYER}' outputs [2, 16, 32] (units: dim 2)"),
    (("hooks.steer.positive=POS",),
     "error: hooks.steer.negative: required with the other run; a run directory that kept these layers' outputs "
     "(hooks=extract)"),
])
def test_a_bad_vector_source_is_one_line_with_status_2_and_nothing_written(tmp_path, capsys, stored, bad, message):
    np.save(tmp_path / "v7.npy", np.ones(7))
    bad = tuple(b.replace("VECTOR", str(tmp_path / "v7.npy")).replace("POS", str(stored["pos"])) for b in bad)
    message = message.replace("VECTOR", str(tmp_path / "v7.npy"))
    with pytest.raises(SystemExit) as exit_:
        cli([*GPT2, "hooks=steer", f"hooks.steer.layers={LAYER}", *bad], tmp_path / "out")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [message]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_unsteered_pass_needs_the_runner_s_loop_and_runner_attach_says_so(tmp_path):
    np.save(tmp_path / "v.npy", np.ones(32))
    with pytest.raises(ConfigError) as refused:
        with runner.attach(gpt2(), hooks={"steer": {"type": "steer", "layers": LAYER, "file": str(tmp_path / "v.npy")}},
                           out_dir=tmp_path / "run"):
            pass
    assert str(refused.value) == ("hooks.steer.baseline: the unsteered pass beside each step needs the runner's loop "
                                  "(python -m runner); in your own loop set hooks.steer.baseline=false")
    assert not (tmp_path / "run").exists()
