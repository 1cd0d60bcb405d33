"""``hooks=units`` over whole datasets equals float64 statistics of every activation held in memory.

The oracle is a plain PyTorch loop in each test: the same model (same seed), the dataset read in
index order by its own code (scikit-learn's digits, torchvision's ``ImageFolder``, the token ids),
forward hooks keeping every output in float64; statistics by numpy over all of them at once.
"""
from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torchvision import datasets, transforms

from conftest import built, image_folder_of, make_config, run
from common.errors import ConfigError
from runner.analysis.units import (layer_second_moment, load_unit_examples, load_unit_inputs, load_unit_names,
                                   load_units, unit_quantiles)
from runner.engine.plan import compile_plan
from runner.sources.models import build_model

pytestmark = pytest.mark.statistics

QS = [0.01, 0.1, 0.5, 0.9, 0.99]


def activations(model_cfg, layers: dict[str, int], inputs: list[torch.Tensor], seed: int = 0) -> dict[str, np.ndarray]:
    """Every output of ``layers`` (name -> unit axis) over ``inputs``, as float64 ``[samples, positions, units]``."""
    torch.manual_seed(seed)
    model = build_model(model_cfg).eval()
    kept = {name: [] for name in layers}
    modules = dict(model.named_modules())

    def keep(name):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            out = out.detach().to(torch.float64).movedim(layers[name], -1)
            kept[name].append(out.reshape(out.shape[0], -1, out.shape[-1]).numpy())
        return hook

    handles = [modules[name].register_forward_hook(keep(name)) for name in layers]
    with torch.no_grad():
        for x in inputs:
            model(x)
    for h in handles:
        h.remove()
    return {name: np.concatenate(parts) for name, parts in kept.items()}


def ranked(values: np.ndarray, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the k best samples of ``values`` ``[samples, units]``: by value, ties by the lower sample."""
    samples = np.arange(len(values))
    order = [np.lexsort((samples, -values[:, u] if largest else values[:, u]))[:k] for u in range(values.shape[1])]
    return np.array(order), np.array([values[o, u] for u, o in enumerate(order)])


def check_layer(units, layer: str, acts: np.ndarray, k: int, threshold: float = 0.0, sketch_low: float = 1e-6):
    rows = units[units.layer == layer].sort_values("unit")
    n_units = acts.shape[2]
    assert list(rows.unit) == list(range(n_units))
    flat = acts.reshape(-1, n_units)
    assert (rows["count"] == len(flat)).all()
    np.testing.assert_allclose(rows["mean"], flat.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rows.variance, flat.var(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(rows["min"], flat.min(0))
    np.testing.assert_array_equal(rows["max"], flat.max(0))
    np.testing.assert_array_equal(rows.above, (flat > threshold).sum(0))
    for largest, prefix in ((True, "top"), (False, "bottom")):
        per_sample = acts.max(1) if largest else acts.min(1)
        where = acts.argmax(1) if largest else acts.argmin(1)
        samples, values = ranked(per_sample, k, largest)
        np.testing.assert_array_equal(np.stack(rows[f"{prefix}_sample"].to_list()), samples)
        np.testing.assert_array_equal(np.stack(rows[f"{prefix}_value"].to_list()), values)
        positions = np.array([where[s, u] for u, s in enumerate(samples)])
        np.testing.assert_array_equal(np.stack(rows[f"{prefix}_position"].to_list()), positions)
    estimated = unit_quantiles(rows, QS)
    for q in QS:
        exact = np.quantile(flat, q, axis=0, method="lower")
        error = np.abs(estimated[f"q{q:g}"].to_numpy() - exact)
        bound = rows.relative_error.to_numpy() * np.abs(exact) * (1 + 1e-9) + sketch_low
        assert (error <= bound).all(), (layer, q, (error - bound).max())


def test_digits_through_digits_cnn_every_statistic_equals_float64_over_all_activations(tmp_path):
    out = run(make_config("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "hooks=units", "loss=none",
                          "hooks.units.layers=[conv1,relu2,fc]", "hooks.units.top_k=5", "progress=false"),
              tmp_path / "run")
    units = load_units(out)
    digits = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16.0
    plan = compile_plan(make_config("model=digits_cnn", "data=digits"))
    acts = activations(plan.model, {"conv1": 1, "relu2": 1, "fc": 1}, list(digits.split(64)))
    for layer, a in acts.items():
        check_layer(units, layer, a, k=5)
    assert acts["conv1"].shape[0] == 1797  # every digit once, held-out part included


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> str:
    return image_folder_of(tmp_path_factory.mktemp("images"), 200, seed=0)


IMAGES = ("model=resnet18", "data=imagefolder", "data.resize=32", "data.crop=32", "data.batch_size=50",
          "mode=eval", "epochs=1", "loss=none", "progress=false")
RESNET_LAYERS = {"conv1": 1, "layer1.0.conv1": 1, "layer3": 1, "layer4.1.conv2": 1, "fc": 1}


def image_inputs(path: str) -> list[torch.Tensor]:
    tf = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    folder = datasets.ImageFolder(path, transform=tf)
    return list(torch.stack([folder[i][0] for i in range(len(folder))]).split(50))


@pytest.fixture(scope="module")
def resnet_units(tmp_path_factory, image_folder) -> Path:
    """A units run of resnet18 over the image folder (its random weights from the run's seed)."""
    return run(make_config(*IMAGES, f"data.path={image_folder}", "hooks=units",
                           f"hooks.units.layers=[{','.join(RESNET_LAYERS)}]", "hooks.units.top_k=7",
                           "hooks.units.second_moment=true"), tmp_path_factory.mktemp("resnet") / "run")


def test_imagefolder_through_resnet18_every_statistic_equals_float64(resnet_units, image_folder):
    units = load_units(resnet_units)
    plan = compile_plan(make_config(*IMAGES, f"data.path={image_folder}"))
    acts = activations(plan.model, RESNET_LAYERS, image_inputs(image_folder))
    for layer, a in acts.items():
        check_layer(units, layer, a, k=7)
    flat = acts["layer4.1.conv2"].reshape(-1, 512)
    np.testing.assert_allclose(layer_second_moment(units, "layer4.1.conv2"), flat.T @ flat / len(flat),
                               rtol=1e-9, atol=1e-12)


def test_a_resnet18_report_draws_each_layer_s_best_unit_within_its_budget_under_a_megabyte(resnet_units):
    from runner.analysis import report
    from runner.analysis.plots import DPI

    page = report.write_report(resnet_units).read_text()
    assert len(page.encode()) < 1_000_000
    section = units_section(page)
    units = load_units(resnet_units)
    chosen = []  # 4 of the 5 layers, evenly spread in the model's order (layer3 before layer4.1.conv2); 3 units each, as the answer
    for layer in ("conv1", "layer1.0.conv1", "layer4.1.conv2", "fc"):
        rows = units[units.layer == layer]
        chosen += [(layer, str(rows.unit.iloc[i])) for i in np.lexsort((rows.unit, -rows["max"]))[:3]]
    grids = re.findall(r'<img alt="top samples of (\S+) unit (\d+)" src="data:image/png;base64,([^"]+)"', section)
    drawn = [(layer, unit) for layer, unit, _ in grids]
    assert drawn == [c for c in chosen if c in drawn] and set(chosen[::3]) <= set(drawn)  # every layer's best
    assert sum(len(base64.b64decode(data)) for *_, data in grids) <= report.MOST_TOP_EXAMPLE_BYTES
    assert all(png_size(data) == (4 * 2.4 * DPI, (2.6 + 0.4) * DPI) for *_, data in grids)
    left = [f"{layer} unit {unit}" for layer, unit in chosen if (layer, unit) not in drawn]
    assert left, "random noise makes large grids: some are left out"
    assert f"Left out to keep the page small (600 kB of these pictures at most): {', '.join(left)}." in section
    assert "<h2>Activation patching</h2>" not in page and "<h2>Pictures</h2>" not in page


def test_tokens_through_gpt2_tiny_every_statistic_equals_float64(tmp_path):
    pytest.importorskip("transformers")
    common = ("model=gpt2_tiny", "data=tokens", "data.size=30", "data.seed=4", "mode=eval", "epochs=1", "loss=none",
              "progress=false")
    layers = {"transformer.h.0.mlp": 2, "transformer.h.1": 2, "lm_head": 2}
    out = run(make_config(*common, "hooks=units", f"hooks.units.layers=[{','.join(layers)}]",
                          "hooks.units.threshold=0.5"), tmp_path / "run")
    units = load_units(out)
    tokens = torch.randint(0, 100, (30, 16), generator=torch.Generator().manual_seed(4))
    plan = compile_plan(make_config(*common))
    acts = activations(plan.model, layers, list(tokens.split(2)))
    for layer, a in acts.items():
        check_layer(units, layer, a, k=16, threshold=0.5)
    assert list(units.position_shape.iloc[0]) == [16]  # a token's position in its sequence


def test_four_shards_cover_the_dataset_once_and_merge_to_the_one_job_table(tmp_path):
    pytest.importorskip("transformers")
    common = ("model=gpt2_tiny", "data=tokens", "data.size=48", "mode=eval", "epochs=1", "loss=none", "progress=false",
              "hooks=units", "hooks.units.layers=[transformer.h.0.mlp,transformer.h.1,lm_head]",
              "hooks.units.second_moment=true", "hooks.units.top_k=5")
    one = load_units(run(make_config(*common), tmp_path / "one"))
    for shard in range(4):  # shards of 12 sequences: whole batches of 2, so the model computes the same values
        run(make_config(*common, f"data.shard={shard}", "data.num_shards=4"), tmp_path / "sweep" / str(shard))
    merged = load_units(tmp_path / "sweep")
    key = ["hook", "layer", "call", "unit", "rank"]
    examples = [load_unit_examples(path).sort_values(key, ignore_index=True) for path in (tmp_path / "one", tmp_path / "sweep")]
    assert len(examples[0]) == len(one) * 4  # the first 4 (examples) of each unit's top 5
    for column in (*key, "sample", "value", "position"):
        assert (examples[1][column].to_numpy() == examples[0][column].to_numpy()).all(), column
    inputs = [load_unit_inputs(path) for path in (tmp_path / "one", tmp_path / "sweep")]
    assert inputs[0].keys() == inputs[1].keys() == {("units", s) for s in examples[0]["sample"]}
    assert all(np.array_equal(inputs[0][key], inputs[1][key]) for key in inputs[0])
    assert len(merged) == len(one) == 2 * 32 + 100
    assert (merged["count"] == 48 * 16).all()
    for column in ("hook", "layer", "call", "unit", "count", "min", "max", "above", "top_k"):
        assert (merged[column].to_numpy() == one[column].to_numpy()).all(), column
    for column in ("sketch_index", "sketch_count", "top_value", "top_sample", "top_position", "bottom_value",
                   "bottom_sample", "bottom_position"):
        assert all(np.array_equal(a, b) for a, b in zip(merged[column], one[column])), column
    assert {s for samples in merged.top_sample for s in samples} - set(range(12)), "ids of later shards stay global"
    for column in ("mean", "variance"):
        np.testing.assert_allclose(merged[column], one[column], rtol=1e-12, atol=1e-15)
    for a, b in zip(merged.second_moment, one.second_moment):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("overrides, message", [
    (("data.shard=4", "data.num_shards=4"), "data.shard: 4 must be in [0, 3] (data.num_shards=4)"),
    (("data.num_shards=2", "mode=train"), "data.num_shards: 2 but data=digits is a training stream"),
    (("hooks.units.relative_error=2",), "hooks.units.relative_error: 2.0 must be in [1e-6, 1)"),
    (("hooks.units.sketch_high=1e39",), "hooks.units.sketch_high: 1e+39 must be above sketch_low=1e-06 and at most"),
    (("hooks.units.sketch_low=1e-40",), "hooks.units.sketch_low: 1e-40 must be in [1.17549e-38, 3.40282e+38]"),
    (("eval_every=1",), "hooks.units: 'units' sums over the run's own pass"),
])
def test_bad_settings_fail_before_the_run_naming_the_key(overrides, message):
    base = ["model=digits_cnn", "data=digits", "mode=eval", "hooks=units", "loss=none"]
    with pytest.raises(ConfigError, match=None) as info:
        compile_plan(make_config(*base, *overrides))
    assert message in str(info.value)


def test_top_tokens_shows_each_top_sequence_around_its_maximum(tmp_path):
    pytest.importorskip("transformers")
    from runner.analysis.unit_plots import top_tokens

    out = run(make_config("model=gpt2_tiny", "data=tokens", "data.size=10", "mode=eval", "epochs=1", "loss=none",
                          "progress=false", "hooks=units", "hooks.units.layers=[lm_head]", "hooks.units.top_k=3"),
              tmp_path / "run")
    units = load_units(out)
    tokens = torch.randint(0, 100, (10, 16), generator=torch.Generator().manual_seed(0))
    fig = top_tokens(units, "lm_head", 7, tokens, lambda ids: [f"t{i}" for i in ids], context=2)
    text = fig.axes[0].texts[0].get_text().splitlines()
    row = units[(units.layer == "lm_head") & (units.unit == 7)].iloc[0]
    for line, sample, position in zip(text, row.top_sample, row.top_position):
        assert f"#{sample:<5d} pos {position:<3d}" in line
        assert f"[t{int(tokens[sample, position])}]" in line


def test_a_requeued_dataset_pass_resumes_and_writes_the_uninterrupted_units_table(tmp_path, monkeypatch):
    from runner.engine import loop
    from test_resume import requeued_in_step

    overrides = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false",
                 "hooks=units", "hooks.units.layers=[conv1,fc]", "hooks.units.top_k=4", "hooks.units.second_moment=true")
    whole = load_units(run(make_config(*overrides), tmp_path / "whole", overrides))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real = requeued_in_step(12, monkeypatch)
    with pytest.raises(SystemExit):
        run(make_config(*overrides), tmp_path / "requeued", overrides)
    monkeypatch.setattr(loop, "train_step", real)
    resumed = load_units(run(make_config(*overrides), tmp_path / "requeued", overrides))
    for column in whole.columns:
        assert all(np.array_equal(a, b) for a, b in zip(whole[column], resumed[column])), column
    examples = [load_unit_examples(tmp_path / name) for name in ("whole", "requeued")]  # the kept maps resume too
    assert sum(m is not None for m in examples[0]["map"]) == 4 * 16  # conv1's 16 channels have maps; fc's none
    for column in ("layer", "unit", "rank", "sample", "value", "map"):
        assert all(np.array_equal(a, b) for a, b in zip(examples[0][column], examples[1][column])), column
    inputs = [load_unit_inputs(tmp_path / name) for name in ("whole", "requeued")]
    assert inputs[0].keys() == inputs[1].keys() and all(np.array_equal(inputs[0][k], inputs[1][k]) for k in inputs[0])
    names = [load_unit_names(tmp_path / name) for name in ("whole", "requeued")]  # each sample's digit: its class
    digits = load_digits().target
    assert names[0] == names[1] == {("units", s): ("", str(digits[s])) for s in examples[0]["sample"]}


def png_size(data: str) -> tuple[int, int]:
    """Width and height of a base64 PNG, from its IHDR chunk."""
    raw = base64.b64decode(data)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def units_section(page: str) -> str:
    return page.split('<section id="units"><h2>Unit statistics</h2>', 1)[1].split("</section>", 1)[0]


DIGITS_UNITS = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false",
                "hooks=units", "hooks.units.layers=[relu2,fc]", "hooks.units.top_k=2", "hooks.units.threshold=0.5")


def test_the_report_has_a_unit_statistics_section_per_layer(tmp_path):
    from runner.analysis import report

    out = run(make_config(*DIGITS_UNITS), tmp_path / "run", DIGITS_UNITS)
    units = load_units(out)
    page = report.render(out)
    section = units_section(page)
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>\s*(<td>.*?)</tr>", section, re.S)]
    assert [c[1] for c in cells] == list(dict.fromkeys(units.layer)) == ["fc", "relu2"]
    for (hook, layer, call, n, values, mean, above, dead), (name, rows) in zip(cells, units.groupby("layer", sort=False)):
        assert (layer, int(n), int(values)) == (name, len(rows), int(rows["count"].iloc[0]))
        assert float(mean) == pytest.approx(rows["mean"].mean(), rel=1e-3)  # the table shows 4 digits
        assert float(above) == pytest.approx(rows.fraction_above.mean(), rel=1e-3)
        assert int(dead) == int((rows.above == 0).sum())
    assert int(cells[1][7]) > 0  # relu2 has units never above 0.5 over the digits
    pictures = re.findall(r'<img alt="([^"]*)"', section)  # the top examples first, as the summary names them
    assert pictures[0].startswith("top samples of ") and pictures[-1] == "unit means and dead fractions per layer"
    assert "<h2>Activation patching</h2>" not in page and '<section id="patching">' not in page
    empty = run(make_config("model=digits_cnn", "data=digits", "steps=1", "hooks=stats", "progress=false"),
                tmp_path / "plain")
    assert '<section id="units">' not in report.render(empty) and "Unit statistics" not in report.render(empty)


def test_the_report_draws_the_top_digits_of_the_units_with_the_largest_max_of_each_layer(tmp_path):
    from runner.analysis import report
    from runner.analysis.plots import DPI

    out = run(make_config(*DIGITS_UNITS), tmp_path / "run", DIGITS_UNITS)
    units = load_units(out)
    section = units_section(report.render(out))
    expected = []
    for layer in ("relu2", "fc"):  # the model's order; two layers: both drawn
        rows = units[units.layer == layer]
        expected += [f"{layer} unit {rows.unit.iloc[i]}" for i in np.lexsort((rows.unit, -rows["max"]))[:3]]
    grids = re.findall(r'<img alt="top samples of ([^"]*)" src="data:image/png;base64,([^"]+)"', section)
    assert [name for name, _ in grids] == expected
    assert f"Drawn: {', '.join(expected)}: the 3 units with the largest max of each layer" in section
    # top_k=2 samples in a row of 4 cells (2.4 x 2.6 inches) under a 0.4-inch title band
    assert all(png_size(data) == (4 * 2.4 * DPI, (2.6 + 0.4) * DPI) for _, data in grids)


def test_a_report_of_many_layers_draws_a_few_spread_in_the_model_s_order(tmp_path, monkeypatch):
    import pandas as pd

    from runner.analysis import report
    from runner.analysis.plots import DPI

    names = [f"block{i}" for i in range(54)]  # a resnet50's 54 conv and linear outputs, recorded in sorted order
    frame = pd.DataFrame({"layer": sorted(names), "unit": 0})
    spread = report.spread_layers(frame, ["", *names], 16)
    assert spread[0] == "block0" and spread[-1] == "block53" and len(set(spread)) == 16
    steps = np.diff([names.index(name) for name in spread])
    assert steps.min() >= 3 and steps.max() <= 4  # evenly: 53 / 15 apart, rounded
    monkeypatch.setattr(report, "MOST_HISTOGRAM_LAYERS", 1)
    monkeypatch.setattr(report, "MOST_UNIT_LAYERS", 1)
    out = run(make_config(*DIGITS_UNITS), tmp_path / "run", DIGITS_UNITS)
    section = units_section(report.render(out))
    assert "Histograms of 1 of the 2 layers, evenly spread in the model&#x27;s order" in section
    pictures = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', section)
    assert png_size(pictures[-1][1]) == (9 * DPI, (2.1 + 0.6) * DPI)  # one row of panels: relu2's, before fc
    assert [alt for alt, _ in pictures[:-1]] == [f"top samples of relu2 unit {u}" for u in
                                                load_units(out).query("layer == 'relu2'").nlargest(3, "max").unit]
    assert "of each of 1 of the 2 layers, evenly spread in the model" in section


def test_top_images_of_run_shows_each_top_digit_under_its_map_from_a_plain_forward(tmp_path):
    from runner.analysis.unit_plots import top_images_of_run

    out = run(make_config(*DIGITS_UNITS), tmp_path / "run", DIGITS_UNITS)
    units = load_units(out)
    row = units[units.layer == "relu2"].sort_values("max").iloc[-1]
    fig = top_images_of_run(out, units, "relu2", int(row.unit))
    digits = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16.0
    plan = compile_plan(make_config("model=digits_cnn", "data=digits"))
    torch.manual_seed(0)
    model = build_model(plan.model).eval()
    kept = []
    model.relu2.register_forward_hook(lambda m, a, output: kept.append(output[:, int(row.unit)]))
    with torch.no_grad():
        model(digits[list(row.top_sample)])
    for i, (sample, value) in enumerate(zip(row.top_sample, row.top_value)):
        ax = fig.axes[i]
        assert ax.get_title() == f"sample {sample} (class {load_digits().target[sample]}): {value:.3g}"
        image, overlay = ax.images
        np.testing.assert_array_equal(image.get_array(), digits[sample, 0, :, :, None].expand(-1, -1, 3).numpy())
        np.testing.assert_allclose(overlay.get_array(), kept[0][i].numpy(), rtol=1e-6)
        assert float(kept[0][i].max()) == pytest.approx(value, rel=1e-6)


def test_a_gpu_run_s_top_examples_are_drawn_on_the_cpu(tmp_path):
    from runner.analysis import report

    out = run(make_config(*DIGITS_UNITS), tmp_path / "run", DIGITS_UNITS)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("device: auto\n", "device: cuda\n", 1))
    assert "device: cuda" in config.read_text()
    section = units_section(report.render(out))
    assert section.count('<img alt="top samples of ') == 6  # relu2's and fc's three best units (the answer's)


def test_a_units_run_over_a_stream_draws_the_inputs_it_kept_and_one_that_kept_none_says_why(tmp_path):
    """The inputs come from the run's files, not from its data read again: a stream's top examples are
    drawn; a run with ``examples=0`` kept none, and the section says so in one line."""
    from runner.analysis import report

    overrides = ("model=convnet", "steps=1", "mode=eval", "loss=none", "hooks=units", "progress=false")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    section = units_section(report.render(out))
    assert section.count('<img alt="top samples of ') == 3 * load_units(out).layer.nunique() > 0
    none = (*overrides, "hooks.units.examples=0")
    section = units_section(report.render(run(make_config(*none), tmp_path / "none", none)))
    assert ('<p class="note">Not drawn: the run kept no top examples (its units entry had examples: 0, or it was '
            'written before unit_examples.parquet); run it again to draw them.</p>') in section
    assert section.count("<img") == 1  # the histograms only


def test_the_report_shows_a_token_model_s_top_tokens_in_context(tmp_path):
    pytest.importorskip("transformers")
    from runner.analysis import report
    from runner.analysis.unit_plots import top_tokens_of_run

    overrides = ("model=gpt2_tiny", "data=tokens", "data.size=10", "mode=eval", "epochs=1", "loss=none",
                 "progress=false", "hooks=units", "hooks.units.layers=[transformer.h.0.mlp,lm_head]",
                 "hooks.units.top_k=6")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    units = load_units(out)
    section = units_section(report.render(out))
    expected = []
    for layer in ("transformer.h.0.mlp", "lm_head"):
        rows = units[units.layer == layer]
        expected += [(layer, rows.unit.iloc[i]) for i in np.lexsort((rows.unit, -rows["max"]))[:3]]
    assert re.findall(r'<img alt="top samples of (\S+) unit (\d+)"', section) == [(l, str(u)) for l, u in expected]
    assert "(token ids as numbers: the run keeps no tokenizer)" in section
    tokens = torch.randint(0, 100, (10, 16), generator=torch.Generator().manual_seed(0))
    layer, unit = expected[-1]
    lines = top_tokens_of_run(out, units, layer, unit, shown=4).axes[0].texts[0].get_text().splitlines()
    row = units[(units.layer == layer) & (units.unit == unit)].iloc[0]
    assert len(lines) == 4
    for line, sample, position in zip(lines, row.top_sample, row.top_position):
        assert f"#{sample:<5d} pos {position:<3d}" in line and f"[{int(tokens[sample, position])}]" in line


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("relative_error", [0.01, 1e-4])
def test_the_c_kernel_and_the_eager_passes_give_the_same_statistics_at_every_magnitude(monkeypatch, dtype,
                                                                                       relative_error):
    """Zeros, values below ``sketch_low``, above ``sketch_high``, infinities and bucket edges: every
    accumulator of the kernel equals the eager float64 passes', and the moments equal numpy's."""
    from hooks.kernels import native
    from common.unit_sketch import SketchGrid
    from hooks.kernels.unit_stats import UnitStats

    built(native.units_kernel(), "units kernel")
    grid = SketchGrid(relative_error, 1e-6, 1e6)
    edge = torch.from_numpy(grid.edges(np.array([grid.first + 40]))[0])  # a bucket's smallest float32, and the one below
    below = torch.nextafter(edge.float(), torch.zeros(1)).double()
    special = torch.tensor([0.0, -0.0, 1e-7, -1e-6, 1e6, -2e6, 3e30, 1.0, -1.0, float(edge), -float(below)])
    batches = [torch.randn(5, 3, 12, dtype=dtype) * 50 + 1000 for _ in range(3)]
    batches[1][2, 1, :len(special)] = special.to(dtype)
    infinite = torch.randn(4, 3, 7, dtype=dtype)
    infinite[1, 2, 3], infinite[2, 0, 0], infinite[0, 1, 0] = float("inf"), float("-inf"), float("inf")
    both = []
    for use_kernel in (True, False):
        if not use_kernel:
            monkeypatch.setattr(native, "_units_kernel", False)
        stats, extremes = UnitStats(3, 4, 0.5, grid, False, [12]), UnitStats(3, 4, 0.5, grid, False, [7])
        for i, x in enumerate(batches):
            stats.update(x, torch.arange(5 * i, 5 * i + 5))
        extremes.update(infinite, torch.arange(4))
        kept = ("sketch", "min", "max", "above", "top_position", "mean")  # an infinite first value: mean +-inf, not NaN
        both.append((stats.state(), {k: extremes.state()[k] for k in kept}))
    for kernel, eager in zip(*both):
        for key, value in kernel.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and key in ("mean", "m2"):
                torch.testing.assert_close(value, eager[key], rtol=1e-12, atol=0, msg=key)
            elif isinstance(value, torch.Tensor):
                assert torch.equal(value, eager[key]), key
            else:
                assert value == eager[key], key
    flat = torch.cat(batches).transpose(1, 2).reshape(-1, 3).double().numpy()
    kernel = both[0][0]
    np.testing.assert_allclose(kernel["mean"].numpy(), flat.mean(0), rtol=1e-12)
    np.testing.assert_allclose(kernel["m2"].numpy() / kernel["count"], flat.var(0), rtol=1e-9)


@pytest.mark.parametrize("relative_error", [0.05, 0.01, 1e-4])
def test_every_magnitude_is_within_the_relative_error_of_its_buckets_value(relative_error):
    """The sketch's promise, bucket by bucket: random magnitudes over [sketch_low, sketch_high] and both
    sides of about 2,000 bucket edges (every edge at 5% and 1%), each read back as its bucket's value,
    within relative_error (float64)."""
    from common.unit_sketch import SketchGrid

    grid = SketchGrid(relative_error, 1e-6, 1e6)
    per_octave = grid.multiplier * 2 ** 23  # the README: about 50 at 1%, 1.4 times the log mapping's 35
    log_per_octave = 1 / math.log2((1 + relative_error) / (1 - relative_error))
    assert relative_error != 0.01 or (49 < per_octave < 50 and 34 < log_per_octave < 35)
    keys = np.arange(grid.first + 1, grid.last, max(1, (grid.last - grid.first) // 2000))
    edge = grid.edges(keys)[0].astype(np.float32)
    below = np.nextafter(edge, np.float32(0))
    assert (grid.index(edge.astype(np.float64)) == grid.index(below.astype(np.float64)) + 1).all(), \
        "an edge starts the next bucket"
    rng = np.random.default_rng(0)
    magnitudes = np.concatenate([10 ** (rng.random(200_000) * 12 - 6), edge, below])
    x = (magnitudes * np.where(rng.random(len(magnitudes)) < 0.5, -1.0, 1.0)).astype(np.float32).astype(np.float64)
    inside = (np.abs(x) >= 1e-6) & (np.abs(x) <= 1e6)
    error = np.abs(grid.value(grid.index(x)) - x)
    assert inside.sum() > 200_000 and (error[inside] <= relative_error * np.abs(x)[inside]).all()
    assert (grid.value(grid.index(np.array([0.0, 5e-7, -5e-7]))) == 0).all()


def test_a_units_table_of_another_sketch_mapping_is_refused_naming_the_file(tmp_path):
    """A ``units.parquet`` of an earlier version (log buckets, no ``sketch_mapping``) would give wrong
    quantiles: ``load_units`` refuses it in one line naming the file."""
    import pyarrow.parquet as pq

    out = run(make_config("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false",
                          "hooks=units", "hooks.units.layers=[fc]"), tmp_path / "run")
    assert set(load_units(out).sketch_mapping) == {"float32-linear"}
    file = next(out.rglob("units.parquet"))
    pq.write_table(pq.read_table(file).drop(["sketch_mapping"]), file)
    with pytest.raises(ValueError, match="another bucket mapping") as info:
        load_units(out)
    assert str(file) in str(info.value)


def test_the_units_kernel_gives_the_same_state_on_one_thread_and_on_two():
    """The kernel splits units over PyTorch's OpenMP threads: each unit's sketch row and sums are one
    thread's, so the state is bit for bit the single-threaded one."""
    from common.unit_sketch import SketchGrid
    from hooks.kernels.unit_stats import UnitStats

    grid = SketchGrid(0.01, 1e-6, 1e6)
    batches = [torch.randn(6, 37, 50) * 3 + 1 for _ in range(3)]
    from hooks.kernels import native

    built(native.units_kernel(), "units kernel")
    library = native.library_path(native.compiler_command(), native.UNITS_SOURCE, native.OPENMP)
    assert b"GOMP_parallel" in library.read_bytes(), "the kernel was built without OpenMP: one thread only"
    states, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            stats = UnitStats(37, 5, 0.0, grid, False, [50])
            for i, x in enumerate(batches):
                stats.update(x, torch.arange(6 * i, 6 * i + 6))
            states.append(stats.state())
    finally:
        torch.set_num_threads(threads)
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]) if isinstance(value, torch.Tensor) else value == states[1][key], key


def test_a_compiler_without_openmp_builds_the_units_kernel_single_threaded(monkeypatch, tmp_path):
    """The flags beyond the common ones are tried in order: a compiler that refuses OpenMP's (here a flag
    no compiler knows) still builds the kernel, without them, and its statistics are the eager ones."""
    from hooks.kernels import native
    from common.unit_sketch import SketchGrid
    from hooks.kernels.unit_stats import UnitStats

    monkeypatch.setenv("HOOK_RUNNER_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "OPENMP", ("-fno-such-flag-anywhere",))
    monkeypatch.setattr(native, "_units_kernel", None)
    built(native.units_kernel(), "units kernel")
    assert [p.name for p in tmp_path.iterdir()] == [native.library_path(native.compiler_command(), native.UNITS_SOURCE).name]
    x, grid = torch.randn(4, 3, 9), SketchGrid(0.01, 1e-6, 1e6)
    kernel = UnitStats(3, 2, 0.0, grid, False, [9])
    kernel.update(x, torch.arange(4))
    monkeypatch.setattr(native, "_units_kernel", False)
    eager = UnitStats(3, 2, 0.0, grid, False, [9])
    eager.update(x, torch.arange(4))
    assert torch.equal(kernel.state()["sketch"], eager.state()["sketch"])
    torch.testing.assert_close(kernel.state()["mean"], eager.state()["mean"], rtol=1e-12, atol=0)


def test_a_saved_state_of_another_sketch_layout_is_refused_not_written_past(tmp_path):
    """A pass resumed from state saved with another bucket layout (an earlier version, other sketch
    settings) would make the kernel write past each unit's row: one line naming the entry and layer."""
    from hooks import HookSession, build_hooks

    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    (units,) = build_hooks({"units": {"type": "units", "layers": ["0"]}})
    with HookSession(model, [units]):
        model(torch.randn(5, 4))
    state = units.run_state()
    (fresh,) = build_hooks({"units": {"type": "units", "layers": ["0"]}})
    fresh.restore_run_state(state)  # the same layout: taken as it is
    assert torch.equal(fresh.stats[("0", 0)].sketch, units.stats[("0", 0)].sketch)
    state["stats"][("0", 0)]["sketch"] = state["stats"][("0", 0)]["sketch"][:, :2765]  # the log mapping's size
    with pytest.raises(ConfigError, match=r"hooks.units: the saved state of layer '0' holds sketches of 2765 buckets"):
        fresh.restore_run_state(state)


def test_the_kept_maps_are_of_the_entry_s_slot_of_a_tuple_output():
    """A layer returning a tuple: the maps kept are of the tensor the entry read (its ``slot``), not the first."""
    from common.records import UNIT_EXAMPLES
    from hooks import HookSession, build_hooks

    class Pair(torch.nn.Module):
        def forward(self, x):
            return x.mean(1, keepdim=True), x * 2  # slot "0": [n, 1, H, W]; slot "1": [n, C, H, W]

    model = torch.nn.Sequential()
    model.add_module("pair", Pair())
    x = torch.randn(3, 4, 5, 5)
    (units,) = build_hooks({"units": {"type": "units", "layers": ["pair"], "slot": "1", "top_k": 2, "examples": 2}})
    with HookSession(model, [units]):
        model(x)
    table = units.tables()[UNIT_EXAMPLES]
    assert len(table["map"]) == 4 * 2
    for unit, sample, kept, shape in zip(table["unit"], table["sample"], table["map"], table["map_shape"]):
        assert shape == [5, 5]
        np.testing.assert_array_equal(np.array(kept, np.float32).reshape(5, 5), (x * 2)[sample, unit].numpy())


def test_the_top_k_order_is_one_rule_where_the_hook_ranks_and_where_the_reader_merges(monkeypatch):
    """A NaN sample, ties and two parts: the reader's merge of two parts' top-k (``load_units``) is the
    hook's top-k over all the samples (NaN the largest: first among the top, last among the bottom;
    ties by the lower sample id). Eager passes: the kernel's NaN is hooks/native's."""
    import pandas as pd

    from common.unit_sketch import SketchGrid
    from hooks.kernels import native
    from hooks.kernels.unit_stats import UnitStats
    from runner.analysis.units import _merge

    monkeypatch.setattr(native, "_units_kernel", False)
    x = torch.tensor([[1.0, 2.0], [3.0, 3.0], [float("nan"), 0.0], [3.0, -1.0], [2.0, 0.5], [0.0, 3.0]]).view(6, 1, 2)
    grid = SketchGrid(0.01, 1e-6, 1e6)

    def stats(rows):
        kept = UnitStats(1, 3, 0.0, grid, False, [2])
        kept.update(x[rows], torch.tensor(rows))
        return kept

    whole, parts = stats([0, 1, 2, 3, 4, 5]), [stats([3, 4, 5]), stats([0, 1, 2])]
    assert whole.top_sample[:, 0].tolist() == [2, 1, 3] and whole.bottom_sample[:, 0].tolist() == [3, 5, 4]
    frame = pd.DataFrame([{"top_k": 3, "count": 2 * len(p.top_sample), "mean": 0.0, "m2": 0.0, "min": 0.0, "max": 0.0,
                           "above": 0, "sketch_index": np.array([], np.int32), "sketch_count": np.array([], np.int64),
                           "second_moment": [],
                           **{key: getattr(p, key)[:, 0].numpy() for key in ("top_value", "top_sample", "top_position",
                                                                             "bottom_value", "bottom_sample",
                                                                             "bottom_position")}} for p in parts])
    merged = _merge(frame)
    for key in ("top_sample", "top_position", "bottom_sample", "bottom_position"):
        assert merged[key].tolist() == getattr(whole, key)[:, 0].tolist(), key
