"""A sample is named by what it is in every pass: its dataset index and class travel with it from the
data source through shuffling, the held-out split, sharding and a requeued job's resume into the
tables that name inputs; a source that cannot say (``data=randn``) says so.

The oracle is the data read by its own code (scikit-learn's ``load_digits``, the test dataset's
items) and the model fed that one item through a plain PyTorch forward hook, with the weights the
run held at the step it kept the sample: its own resume checkpoint (``.resume``, ``common.resume_point``) for the
steps after a requeue, the model built from the run's seed for step 0.
"""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.datasets import load_digits

from common.resume_point import read_resume_point
from conftest import make_config, run
from runner.analysis.units import UNNAMED, load_unit_examples, load_units, top_units
from runner.engine import loop
from runner.engine.plan import compile_plan
from runner.sources.models import build_model
from test_resume import requeued_in_step

DIGITS = load_digits()
IMAGES = torch.tensor(DIGITS.images, dtype=torch.float32).unsqueeze(1) / 16.0


def conv1_maps(model_cfg, state: dict | None, seed: int, samples: list[int]) -> torch.Tensor:
    """``conv1``'s output for each digit of ``samples`` fed alone, through a forward hook, with the
    weights ``state`` (``None``: as the run builds the model from its seed, before any step)."""
    torch.manual_seed(seed)
    model = build_model(model_cfg)
    if state is not None:
        model.load_state_dict(state)
    seen = []
    handle = model.conv1.register_forward_hook(lambda module, args, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            for s in samples:
                model(IMAGES[s:s + 1])
    finally:
        handle.remove()
    return torch.cat(seen)


def training_order(data_cfg, seed: int, steps: int) -> dict[int, int]:
    """The step at which each digit reached the model in the first epoch: scikit-learn's digits
    split by ``split_seed`` and shuffled by the run's seed, by hand."""
    n = len(DIGITS.target)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(data_cfg.split_seed)))
    train = order[round(n * float(data_cfg.held_out)):]
    gen = torch.Generator().manual_seed(seed + int(data_cfg.get("seed") or 0))
    epoch = train[torch.randperm(len(train), generator=gen)].tolist()
    size = int(data_cfg.batch_size)
    return {s: k for k in range(steps) for s in epoch[k * size:(k + 1) * size]}


def check_examples(out, model_cfg, weights: dict[int, dict | None], step_of: dict[int, int], seed: int) -> None:
    """Every kept example of ``out``: its sample is a digit the run fed, its class that digit's label,
    its input that digit, and its value and position what that digit gives through the model with the
    weights of the step that fed it."""
    examples = load_unit_examples(out)
    inputs = pd.read_parquet(out / "unit_inputs.parquet").set_index("sample")
    assert set(examples["sample"]) == set(inputs.index)
    for s, row in inputs.iterrows():
        assert row.input_class == str(DIGITS.target[s]), s
        np.testing.assert_array_equal(np.asarray(row.input, np.float32), IMAGES[s].reshape(-1).numpy())
    for step, state in weights.items():
        mine = examples[[step_of[s] == step for s in examples["sample"]]]
        samples = sorted(set(mine["sample"]))
        if not samples:
            continue
        maps = dict(zip(samples, conv1_maps(model_cfg, state, seed, samples).flatten(2)))
        for row in mine.itertuples():
            channel = maps[row.sample][row.unit]
            torch.testing.assert_close(float(channel.max()), row.value, rtol=1e-5, atol=1e-6)
            assert int(channel.argmax()) == row.position, (row.sample, row.unit)
    assert examples.named.all() and inputs.named.all()


def test_a_shuffled_training_pass_resumed_twice_names_each_kept_digit_by_its_index_and_class(tmp_path, monkeypatch):
    """The issue's command (``optimizer=sgd``, shuffled digits) as a requeued job: requeued in step 1
    and again in step 2. Each kept input is the digit ``load_digits()`` holds at its sample id, of its
    class, and gives the recorded value through the weights of the step that fed it, read from the
    run's own resume checkpoint."""
    overrides = ("model=digits_cnn", "data=digits", "hooks=units", "optimizer=sgd", "loss=cross_entropy",
                 "optimizer.lr=0.5", "steps=3", "hooks.units.layers=[conv1]", "hooks.units.top_k=4", "progress=false")
    out = tmp_path / "run"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    weights = {0: None}
    real = loop.train_step
    for step in (1, 2):  # requeued inside ``step``: the state after the steps before it is kept
        requeued_in_step(1 if step == 2 else step, monkeypatch)
        try:
            run(make_config(*overrides), out, overrides)
        except SystemExit:
            pass
        else:
            raise AssertionError(f"the run was not requeued in step {step}")
        state, _ = read_resume_point(out)
        assert state["step"] == step
        weights[step] = state["model"]
        monkeypatch.setattr(loop, "train_step", real)
    run(make_config(*overrides), out, overrides)
    assert not (out / ".resume").exists()
    plan = compile_plan(make_config(*overrides))
    step_of = training_order(plan.data.data, plan.settings.seed, 3)
    assert weights[1] is not None and any(not torch.equal(weights[1][k], weights[2][k]) for k in weights[1])
    check_examples(out, plan.model, weights, step_of, plan.settings.seed)
    kept = set(load_unit_examples(out)["sample"])
    assert {step_of[s] for s in kept} == {0, 1, 2}  # examples from every step's weights were checked
    assert max(kept) >= 3 * 64  # dataset indices, not places in a stream of 192 samples


def test_a_sharded_requeued_dataset_pass_names_its_digits_by_their_index_in_the_whole_dataset(tmp_path, monkeypatch):
    """``mode=eval`` over shard 1 of 3, requeued in step 2: the ids are the dataset's own (in the shard's
    range), with their classes, and each gives its value through the run's (untrained) model."""
    overrides = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false",
                 "data.shard=1", "data.num_shards=3", "hooks=units", "hooks.units.layers=[conv1]",
                 "hooks.units.top_k=3")
    out = tmp_path / "run"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real = requeued_in_step(2, monkeypatch)
    try:
        run(make_config(*overrides), out, overrides)
    except SystemExit:
        pass
    monkeypatch.setattr(loop, "train_step", real)
    run(make_config(*overrides), out, overrides)
    plan = compile_plan(make_config(*overrides))
    n = len(DIGITS.target)
    shard = range(n // 3, 2 * n // 3)
    assert set(load_unit_examples(out)["sample"]) <= set(shard)
    check_examples(out, plan.model, {0: None}, dict.fromkeys(shard, 0), plan.settings.seed)


def test_a_shuffled_dataset_stream_carries_each_item_s_index_through_the_held_out_split():
    """``data=dataset`` with a held-out part and shuffling: item ``i`` of ``Squares`` is the vector of
    ``i``'s, so each row's sample id must be the value it holds, in training and held-out batches."""
    overrides = ("model=mlp", "data=dataset", "data._target_=datasets_for_tests.Squares", "+data.kwargs.n=50",
                 "data.held_out=0.3", "data.batch_size=8", "data.shuffle=true")
    data = compile_plan(make_config(*overrides)).data
    seen = []
    for held_out in (False, True):
        stream = data.batches(3, torch.device("cpu"), held_out=held_out)
        for _ in range(5):
            batch = next(stream)
            assert batch.samples is not None
            assert torch.equal(batch.samples, batch.x[:, 0].long()), held_out
            seen.append(batch.samples)
    assert not torch.equal(torch.cat(seen[:5])[:8], torch.arange(8))  # shuffled, not read in order


def test_a_random_stream_says_its_samples_are_unnamed(tmp_path):
    """``data=randn`` has no items: ``named`` is false in every table and the answer says ``unnamed``."""
    overrides = ("model=convnet", "data=randn", "steps=2", "mode=eval", "loss=none", "hooks=units", "progress=false")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    assert not load_units(out).named.any()
    assert not load_unit_examples(out).named.any()
    assert not pd.read_parquet(out / "unit_inputs.parquet").named.any()
    assert set(top_units(out)["input"]) == {UNNAMED}
    from runner.analysis.unit_plots import top_images_of_run

    units = load_units(out)
    titles = [ax.get_title() for ax in top_images_of_run(out, units, "conv", 0).axes if ax.get_title()]
    assert titles and all(title.startswith(f"{UNNAMED}: ") for title in titles)


def test_a_digits_run_says_its_samples_are_named():
    """The opposite of the random stream, in the answer: a digit is ``sample N`` with its class."""
    from runner.sources.data import DataSource

    plan = compile_plan(make_config("model=digits_cnn", "data=digits"))
    source = DataSource(plan.data.data, plan.data.model)
    assert source.sample_names(1489) == ("", str(DIGITS.target[1489]))
    batch = next(source.batches(0, torch.device("cpu")))
    torch.testing.assert_close(batch.x, IMAGES[batch.samples])
    assert torch.equal(batch.targets, torch.as_tensor(DIGITS.target[batch.samples.numpy()]))




def test_a_store_over_a_shuffled_training_stream_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """A store keeps each sample under its own id, in order: a training stream's shuffled digits cannot
    be kept so (they were stored under their place in the stream, as if it were the dataset index)."""
    from common.errors import ConfigError

    overrides = ("model=digits_cnn", "data=digits", "hooks=store", f"hooks.store.path={tmp_path / 'store'}",
                 "hooks.store.layers=[conv1]", "steps=2", "progress=false")
    with pytest.raises(ConfigError, match=r"^hooks.store: the data give their samples shuffled \(ids \d+, .*"
                                          r"add mode=eval for a pass over the dataset in order$"):
        run(make_config(*overrides), tmp_path / "run", overrides)
    assert not (tmp_path / "store").exists()


def test_eval_passes_give_the_recorder_each_held_out_batch_s_ids_and_the_training_batch_s_after():
    """Entries that record during eval passes number the held-out digits by their own indices, not
    by the training batch's (a held-out batch of another size was refused for it)."""
    from hooks.mechanism.recorder import Recorder
    from runner.engine.train import eval_passes
    from runner.sources.batches import Batch

    recorder, seen = Recorder(), []
    recorder.samples = torch.arange(4)
    held_out = [Batch(IMAGES[ids], torch.as_tensor(DIGITS.target[ids]), torch.as_tensor(ids))
                for ids in ([5, 9, 2], [1000, 7])]

    def forward(x):
        seen.append(recorder.samples.tolist())
        return torch.zeros(len(x), 10)

    eval_passes(forward, torch.nn.Linear(1, 1), held_out, None, recorder=recorder)
    assert seen == [[5, 9, 2], [1000, 7]]
    assert recorder.samples.tolist() == [0, 1, 2, 3]


def test_a_folder_of_images_names_each_row_by_its_file(tmp_path):
    """``data=image`` over a folder: every step's batch is the files in name order, row ``i`` named by file ``i``."""
    from PIL import Image

    from runner.sources.data import DataSource

    for name, colour in (("b.png", (255, 0, 0)), ("a.png", (0, 0, 255))):
        Image.new("RGB", (12, 12), colour).save(tmp_path / name)
    cfg = make_config("model=convnet", "data=image", f"data.path={tmp_path}", "data.resize=8", "data.crop=8")
    source = DataSource(cfg.data, cfg.model)
    batch = next(source.batches(0, torch.device("cpu")))
    assert batch.samples.tolist() == [0, 1]
    assert [source.sample_names(i) for i in (0, 1)] == [("a.png", ""), ("b.png", "")]
    assert batch.x[0, 2].mean() > batch.x[0, 0].mean()  # row 0 is a.png, the blue one
