"""A ``units`` run ends with its answer: the top units of each layer and the inputs they respond to, named
as the user knows them (an ``imagefolder`` file's path and class), read from one table, ``top_units``'.

The oracles: the run's ``units.parquet`` read with pyarrow (which units have the largest max, their top
samples and values, their dead fractions), torchvision's ``ImageFolder`` over the same folder (which file
and class each sample id is), and a plain forward of the named file (its value at the unit).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torchvision import datasets

from conftest import cli, image_folder_of, make_config, run
from docs_text import blocks, section
from runner.analysis import top_units
from runner.analysis.units import TOP_UNIT_COLUMNS, load_unit_names

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
SECTION = section("tutorials/units.md", "Unit statistics and top examples")


def readme_units_command() -> list[str]:
    """The units tutorial's run (the second line of its "Unit statistics and top examples" block), as words."""
    block = blocks(SECTION, "bash")[0]
    lines = block.replace("\\\n", " ").splitlines()
    assert shlex.split(lines[0]) == ["python", "assets/make_crops.py", "outputs/crops"]
    return shlex.split(lines[1])


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """The README's units command run in-process from a fresh directory: ``(run dir, what it printed)``."""
    where = tmp_path_factory.mktemp("readme")
    subprocess.run([sys.executable, str(ROOT / "assets/make_crops.py"), str(where / "outputs/crops")], check=True)
    words = readme_units_command()
    assert words[:3] == ["python", "-m", "runner"]
    overrides = [w for w in words[3:] if not w.startswith("hydra.")]
    out = where / next(w for w in words if w.startswith("hydra.run.dir=")).split("=", 1)[1]
    before, printed = os.getcwd(), io.StringIO()
    os.chdir(where)
    try:
        with contextlib.redirect_stdout(printed):
            cli(overrides, out)
    finally:
        os.chdir(before)
    return out, printed.getvalue()


def expected_answer(out: Path, folder: Path) -> dict[str, list[tuple]]:
    """Per layer, from the parquet and the folder alone: its units, its dead units, and its 3 units of the
    largest max (ties: the lower unit) as ``(unit, max, mean, dead fraction, [(file, value), ...], classes)``."""
    table = pq.read_table(out / "units.parquet").to_pandas()
    files = datasets.ImageFolder(str(folder))
    found = {}
    for layer, rows in table.groupby("layer", sort=False):
        best = rows.iloc[np.lexsort((rows.unit.to_numpy(), -rows["max"].to_numpy()))[:3]]
        units = []
        for row in best.itertuples():
            named = [(Path(files.samples[s][0]).relative_to(folder).as_posix(), v)
                     for s, v in zip(row.top_sample[:4], row.top_value[:4])]
            classes = {files.classes[files.samples[s][1]] for s in row.top_sample[:4]}
            units.append((row.unit, row.max, row.mean, 1 - row.above / row.count, named, classes))
        found[layer] = (len(rows), int((rows.above == 0).sum()), units)
    return found


def test_the_readme_units_run_prints_the_top_units_and_their_files_as_the_parquet_holds_them(readme_run):
    out, printed = readme_run
    expected = expected_answer(out, out.parent / "crops")
    assert "units: the 3 units of each layer with the largest response" in printed
    assert "0 statistic rows" not in printed and "recorded nothing" not in printed
    for layer, (count, dead, units) in expected.items():
        assert f"    {layer}: {count} units, {dead} dead (never above the threshold)" in printed.splitlines()
        for unit, most, mean, dead_fraction, named, classes in units:
            inputs = ", ".join(f"{name} {value:.3g}" for name, value in named)
            said = f" (all in class {classes.pop()})" if len(classes) == 1 else None
            line = (f"      unit {unit}: max {most:.3g}, mean {mean:.3g}, dead {100 * dead_fraction:.1f}%; "
                    f"top inputs {inputs}")
            assert any(printed_line.startswith(line) for printed_line in printed.splitlines()), line
            if said:
                assert line + said in printed.splitlines()
    unit_lines = [line for line in printed.splitlines() if re.match(r"      unit \d+: ", line)]
    assert len(unit_lines) == 3 * len(expected)  # nothing but these units


def readme_model(out: Path):
    """The model and image transform the README's units run built (its seed, its config), and its folder."""
    from runner.engine.plan import compile_plan
    from runner.sources.batches import imagenet_transform
    from runner.sources.models import build_model

    folder = out.parent / "crops"
    words = [f"data.path={folder}" if w.startswith("data.path=") else w for w in readme_units_command()[3:]
             if not w.startswith("hydra.")]
    plan = compile_plan(make_config(*words))
    torch.manual_seed(0)
    return build_model(plan.model).eval(), imagenet_transform(plan.data.data), folder


@pytest.fixture(scope="module")
def float64_outputs(readme_run):
    """Plain PyTorch in float64: the README run's model over every image of the folder (ImageFolder's order:
    the run's sample ids), layer3's and layer4's outputs ``[samples, units, h, w]``."""
    model, transform, folder = readme_model(readme_run[0])
    model = model.double()
    files = datasets.ImageFolder(str(folder), transform=transform)
    kept = {"layer3": [], "layer4": []}
    for name in kept:
        getattr(model, name).register_forward_hook(lambda m, a, output, name=name: kept[name].append(output))
    with torch.no_grad():
        for x, _ in torch.utils.data.DataLoader(files, batch_size=16):
            model(x.double())
    return {name: torch.cat(outputs) for name, outputs in kept.items()}, files


def test_the_answer_s_table_is_the_float64_forward_s_top_units_and_their_files(readme_run, float64_outputs):
    """Per layer, from a float64 forward in plain PyTorch: its units and dead units, its 3 units of the largest
    max (ties: the lower unit), their mean and dead fraction, and the 4 files on which each peaks highest."""
    from runner.analysis.answers import answer_of

    out, printed = readme_run
    answer = answer_of(out, "units", "units")
    table = answer.table
    assert list(table.columns) == TOP_UNIT_COLUMNS
    outputs, files = float64_outputs
    for layer, acts in outputs.items():
        peaks = acts.amax((2, 3))  # [samples, units]: each sample's value is its max over positions
        most, dead = peaks.amax(0), (acts <= 0).double().mean((0, 2, 3))
        rows = table[table.layer == layer]
        assert (rows.layer_units == acts.shape[1]).all()
        assert (rows.layer_dead_units == int((most <= 0).sum())).all()
        best = sorted(range(acts.shape[1]), key=lambda u: (-float(most[u]), u))[:3]
        assert list(dict.fromkeys(rows.unit)) == best
        for unit in best:
            of = rows[rows.unit == unit]
            top = sorted(range(len(peaks)), key=lambda s: (-float(peaks[s, unit]), s))[:4]
            assert list(of["sample"]) == top
            assert list(of.input) == [Path(files.samples[s][0]).relative_to(files.root).as_posix() for s in top]
            assert list(of["class"]) == [files.classes[files.samples[s][1]] for s in top]
            np.testing.assert_allclose(of.value, peaks[top, unit].numpy(), rtol=1e-5)
            np.testing.assert_allclose(of["max"], float(most[unit]), rtol=1e-5)
            np.testing.assert_allclose(of["mean"], float(acts[:, unit].mean()), rtol=1e-5)
            np.testing.assert_allclose(of.dead_fraction, float(dead[unit]), atol=2 / acts[:, unit].numel())
    lines = printed.splitlines()  # what the run printed are the answer's lines, read from that table
    first = next(i for i, line in enumerate(lines) if line.startswith("run ")) + 1
    assert [f"    {line}" if i else f"  units: {line}" for i, line in enumerate(answer.lines)] == \
        lines[first:first + len(answer.lines)]


def test_each_named_file_read_again_gives_the_unit_its_recorded_value(readme_run):
    """The name is the right file: the file at that path, through the model the run built from its seed,
    gives the unit its recorded value (max over positions), and its class is its folder's."""
    out, _ = readme_run
    model, transform, folder = readme_model(out)
    table = top_units(out, "layer3")
    kept = []
    model.layer3.register_forward_hook(lambda m, a, output: kept.append(output))
    images = torch.stack([transform(Image.open(folder / name).convert("RGB")) for name in table.input])
    with torch.no_grad():
        model(images)
    values = kept[0][torch.arange(len(table)), torch.tensor(table.unit.tolist())].amax((1, 2))
    np.testing.assert_allclose(values.numpy(), table.value.to_numpy(), rtol=1e-5)
    assert list(table["class"]) == [name.split("/")[0] for name in table.input]


def test_the_top_images_name_their_files_and_class_and_explain_every_mark(readme_run):
    from runner.analysis.unit_plots import CROSS, OUTLINE, top_images_of_run
    from runner.analysis.units import load_units

    out, _ = readme_run
    table = top_units(out, "layer3", k=1)
    unit = int(table.unit.iloc[0])
    fig = top_images_of_run(out, load_units(out), "layer3", unit)
    cells = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in cells] == [f"{name}: {value:.3g}" for name, value in zip(table.input, table.value)]
    classes = set(table["class"])
    title = fig._suptitle.get_text()
    assert title.startswith(f"layer3 unit {unit}: its top 4 inputs") and \
        (f"all in class {classes.pop()}" in title if len(classes) == 1 else "classes " in title)
    heat = cells[0].images[1]
    assert heat.cmap(0.0)[3] == 0 and 0 < heat.cmap(1.0)[3] < 1  # quiet places show the image as it is
    legend = [text.get_text() for legend in fig.legends for text in legend.get_texts()]
    assert legend[0].startswith("outline: the map above 50%") and legend[1].startswith("cross: where this image")
    marks = [line for ax in cells for line in ax.lines]
    assert {line.get_color() for line in marks} == {CROSS} and len(marks) == len(cells)
    assert all(ax.collections for ax in cells) and OUTLINE == "white"  # each image outlined where the unit fires


def test_the_report_says_what_the_units_run_recorded_and_calls_its_steps_a_pass(readme_run):
    from runner.analysis import report

    out, _ = readme_run
    page = report.render(out)
    header = page.split("<h1>hook-runner report</h1>", 1)[1].split("</p>", 1)[0]
    rows = pq.ParquetFile(out / "units.parquet").metadata.num_rows
    assert f"1 run(s), {rows:,} rows of units.parquet" in header and "statistic rows" not in header
    jobs = page.split('<section id="jobs">', 1)[1].split("</section>", 1)[0]
    assert "<th>pass steps</th>" in jobs and "train steps" not in jobs


IMAGES = ("model=resnet18", "data=imagefolder", "data.resize=32", "data.crop=32", "data.batch_size=6",
          "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=units", "hooks.units.layers=[layer2,fc]",
          "hooks.units.top_k=5")


@pytest.mark.slow
def test_a_sharded_sweep_names_its_top_inputs_as_the_one_job_does(tmp_path):
    (tmp_path / "images").mkdir()
    folder = image_folder_of(tmp_path / "images", 24, seed=3)
    one = top_units(run(make_config(*IMAGES, f"data.path={folder}"), tmp_path / "one"), k=4)
    for shard in range(4):  # shards of 6 images: whole batches, the same float32 activations
        run(make_config(*IMAGES, f"data.path={folder}", f"data.shard={shard}", "data.num_shards=4"),
            tmp_path / "sweep" / str(shard))
    merged = top_units(tmp_path / "sweep", k=4)
    assert list(one.layer.unique()) == ["layer2", "fc"]  # the model's order
    assert merged.drop(columns="mean").equals(one.drop(columns="mean"))  # means: to float64 rounding
    np.testing.assert_allclose(merged["mean"], one["mean"], rtol=1e-12)
    files = datasets.ImageFolder(folder)
    assert list(one.input) == [Path(files.samples[s][0]).relative_to(folder).as_posix() for s in one["sample"]]
    assert list(one["class"]) == [files.classes[files.samples[s][1]] for s in one["sample"]]
    assert load_unit_names(tmp_path / "sweep") == load_unit_names(tmp_path / "one")


def test_data_without_names_give_the_sample_id_and_text_its_tokens_around_the_top_one(tmp_path):
    pytest.importorskip("transformers")
    out = run(make_config("model=gpt2_tiny", "data=tokens", "data.size=10", "mode=eval", "epochs=1", "loss=none",
                          "progress=false", "hooks=units", "hooks.units.layers=[lm_head]", "hooks.units.top_k=3"),
              tmp_path / "run")
    tokens = torch.randint(0, 100, (10, 16), generator=torch.Generator().manual_seed(0))
    table = top_units(out, k=2, examples=3)
    units = pq.read_table(out / "units.parquet").to_pandas().set_index("unit")
    for row in table.itertuples():
        position = int(units.top_position[row.unit][row.rank])
        ids = tokens[row.sample].tolist()
        first, last = max(0, position - 4), min(16, position + 5)
        words = [f"[{ids[i]}]" if i == position else str(ids[i]) for i in range(first, last)]
        assert row.input == (f"sample {row.sample}: {'... ' if first else ''}{' '.join(words)}"
                             f"{' ...' if last < 16 else ''}")
        assert row._15 is None  # no class
    assert load_unit_names(out) == {}


def test_the_classes_of_some_examples_are_said_once():
    from runner.analysis.units import classes_said

    assert classes_said(["top", "top", "top"]) == "all in class top"
    assert classes_said(["top", "bottom", "top"]) == "classes top 2, bottom 1"
    assert classes_said(["top", None]) == "classes top 1"  # one example's class is not known: not "all"
    assert classes_said([None, None]) == ""


@pytest.mark.docs_runs
def test_the_how_to_s_own_loop_names_its_top_inputs_by_file_and_class(readme_run):
    """The "Names in your own loop" block of docs/how-to/whole-datasets.md, run as written over the tutorial's
    crops: its top units and inputs are a plain forward's, each named by the file and class ``names=`` gave."""
    from torchvision import models, transforms

    out, _ = readme_run
    where = out.parent.parent
    code = blocks(section("how-to/whole-datasets.md", "Whole datasets and stores").split("**Names in your own loop.**")[1],
                  "python")[0]
    before = os.getcwd()
    os.chdir(where)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "docs/how-to/whole-datasets.md", "exec"), {})
    finally:
        os.chdir(before)
    table = top_units(where / "runs/crops", "layer3", k=3)
    crops = datasets.ImageFolder(str(where / "outputs/crops"),
                                 transforms.Compose([transforms.Resize(64), transforms.ToTensor()]))
    assert list(table.input) == [Path(crops.samples[s][0]).relative_to(crops.root).as_posix() for s in table["sample"]]
    assert list(table["class"]) == [crops.classes[crops.samples[s][1]] for s in table["sample"]]
    torch.manual_seed(0)
    model, seen = models.resnet18().eval(), []
    model.layer3.register_forward_hook(lambda module, args, output: seen.append(output.amax(dim=(2, 3))))
    with torch.no_grad():
        for ids in torch.arange(len(crops)).split(16):  # the page's batches: the same float32 activations
            model(torch.stack([crops[i][0] for i in ids]))
    per_sample = torch.cat(seen)
    units = per_sample.amax(0).topk(3).indices.tolist()
    assert list(dict.fromkeys(table.unit)) == units
    for unit in units:
        values, samples = per_sample[:, unit].topk(4)
        assert list(table[table.unit == unit]["sample"]) == samples.tolist()


def test_the_report_draws_the_top_examples_of_the_units_the_answer_names(readme_run):
    from runner.analysis import report

    out, printed = readme_run
    named = re.findall(r"^(?:    (\w+): \d+ units|      unit (\d+): )", printed, re.M)
    said, layer = [], None
    for new_layer, unit in named:
        layer = new_layer or layer
        said += [f"{layer} unit {unit}"] if unit else []
    units = report.render(out).split('<section id="units">', 1)[1].split("</section>", 1)[0]
    drawn = re.search(r"<p>Drawn: (.*?): the ", units).group(1).split(", ")
    assert len(said) == 6 and sorted(drawn) == sorted(said)
    assert units.count('alt="top samples of ') == len(said)
