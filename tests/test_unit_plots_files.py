"""The top-example pictures are drawn from what the run kept, never computed again.

A run that trains changes its weights after each step: a map computed again from the model rebuilt
from the seed is another model's. The oracle here is the run's own ``units.parquet``: each drawn
map's peak is the unit's recorded top value for that sample (float32, the dtype the maps are kept in).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits

from conftest import make_config, run
from runner.analysis.units import load_units

pytestmark = pytest.mark.statistics
#: Each digit's class, by its index in ``load_digits()``: what a trained run's sample ids are.
DIGIT_CLASSES = load_digits().target

TRAINED = ("model=digits_cnn", "data=digits", "hooks=units", "optimizer=sgd", "steps=20", "loss=cross_entropy",
           "progress=false")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = run(make_config(*TRAINED), tmp_path_factory.mktemp("trained") / "run", TRAINED)
    return out, load_units(out)


def test_a_trained_run_s_drawn_maps_peak_at_its_recorded_top_values(trained):
    """Every drawn map of the units the report draws (and conv1's unit 0) peaks at the recorded top
    value of its sample, within float32 rounding; the title names that sample and value."""
    from runner.analysis import report
    from runner.analysis.unit_plots import top_images_of_run

    out, units = trained
    chosen = report.chosen_units(units, ["conv1", "conv2"])
    drawn = [("conv1", 0)] + list(zip(chosen.layer, chosen.unit))
    assert len(drawn) == 7  # conv1's unit 0, then 3 units of each of the 2 layers
    for layer, unit in drawn:
        row = units[(units.layer == layer) & (units.unit == unit)].iloc[0]
        fig = top_images_of_run(out, units, layer, int(unit))
        cells = [ax for ax in fig.axes if len(ax.images) == 2]
        for ax, sample, value in zip(cells, row.top_sample, row.top_value):
            assert ax.get_title() == f"sample {sample} (class {DIGIT_CLASSES[sample]}): {value:.3g}"
            peak = float(np.max(ax.images[1].get_array()))
            assert peak == pytest.approx(value, rel=2 ** -23, abs=1e-12), (layer, unit, sample)
        assert len(cells) == 4  # the entry's default examples: 4


def test_a_run_that_kept_no_examples_is_refused_in_one_line(tmp_path):
    from runner.analysis.unit_plots import top_images_of_run

    overrides = (*TRAINED[:4], "steps=2", "progress=false", "hooks.units.examples=0")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    with pytest.raises(FileNotFoundError, match=r"wrote unit_examples.parquet \(a units entry with examples > 0"):
        top_images_of_run(out, load_units(out), "conv1", 0)


def test_reading_a_units_table_and_its_examples_imports_no_hooks_module(trained):
    """``units.parquet``'s format lives on the bottom floor (``common.unit_sketch``): the readers and the
    pictures import no hook-type module and no C kernel."""
    out, _ = trained
    code = ("import sys; from runner.analysis.units import load_units, unit_quantiles; "
            "from runner.analysis.unit_plots import top_images_of_run; "
            f"u = load_units({str(out)!r}); unit_quantiles(u, [0.5]); "
            f"top_images_of_run({str(out)!r}, u, 'conv1', 0); "
            "print(sorted(m for m in sys.modules if m == 'hooks' or m.startswith(('hooks.', 'runner.engine', "
            "'runner.sources'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_output_schema_names_every_column_of_the_kept_examples_files():
    from common.records import UNIT_EXAMPLES_SCHEMA, UNIT_INPUTS_SCHEMA
    from docs_text import section

    schema = section("reference/output-schema.md", "Output schema")
    paragraph = schema.split("`units.parquet` exists only", 1)[1].split("\n\n", 1)[0]
    assert "`unit_examples.parquet`" in paragraph and "`unit_inputs.parquet`" in paragraph
    named = [name for schema in (UNIT_EXAMPLES_SCHEMA, UNIT_INPUTS_SCHEMA) for name in schema.names
             if f"`{name}`" not in paragraph]
    assert named == ["hook", "layer", "call", "unit", "hook"]
