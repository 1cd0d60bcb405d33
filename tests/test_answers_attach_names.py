"""``runner.attach`` names a user's samples: ``run.samples(ids, names=...)`` per batch, or ``attach(names=...)``
by id (a sequence such as an ``ImageFolder``'s ``samples``, or a function), so ``top_units`` and the run's
answer call the top inputs what the user calls them. The oracle: the same model run in plain PyTorch in
float64, each sample's maximum over positions per unit, the top samples by value (ties: the lower id)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import runner
from common.errors import ConfigError
from runner.analysis.answers import answer_of
from runner.analysis.units import top_units

pytestmark = pytest.mark.statistics

SAMPLES, BATCH = 12, 4


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    images = torch.randn(SAMPLES, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    model(images[:1])  # the lazy layer takes its shape before anything is hooked
    return model, images


FILES = [(f"folder/{'even' if i % 2 == 0 else 'odd'}/img_{i:02d}.png", "even" if i % 2 == 0 else "odd")
         for i in range(SAMPLES)]


def named_run(out_dir, how: str):
    """A shuffled pass over the images in batches, the samples named ``how``: per batch, by attach's sequence,
    or by attach's function."""
    model, images = model_and_data()
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(2))
    names = {"batch": None, "sequence": FILES, "function": FILES.__getitem__}[how]
    with runner.attach(model, hooks=["units"], overrides=["hooks.units.layers=[0]", "hooks.units.top_k=3",
                                                          "hooks.units.examples=3"],
                       out_dir=out_dir, names=names) as run, torch.no_grad():
        for first in range(0, SAMPLES, BATCH):
            ids = order[first:first + BATCH]
            run.samples(ids, names=[FILES[i] for i in ids] if how == "batch" else None)
            model(images[ids])
            run.step()
    return model, images


@pytest.mark.parametrize("how", ["batch", "sequence", "function"])
def test_top_units_and_the_answer_name_the_samples_the_loop_named(tmp_path, how):
    model, images = named_run(tmp_path / "run", how)
    with torch.no_grad():  # plain PyTorch, float64: each sample's max over positions per unit
        peaks = model.double()[0](images.double()).amax((2, 3))  # [samples, units]
    table = top_units(tmp_path / "run", k=5, examples=3)
    assert len(table) == 5 * 3
    for unit, rows in table.groupby("unit", sort=False):
        values = peaks[:, unit].tolist()
        best = sorted(range(SAMPLES), key=lambda i: (-values[i], i))[:3]
        assert list(rows["sample"]) == best
        assert list(rows.input) == [FILES[i][0] for i in best] and list(rows["class"]) == [FILES[i][1] for i in best]
        assert rows.value.tolist() == pytest.approx([values[i] for i in best], rel=1e-5)
    best_unit = int(peaks.amax(0).argmax())
    assert table.unit.iloc[0] == best_unit  # the unit of the largest response first
    lines = answer_of(tmp_path / "run", "units", "units").lines
    first = table[table.unit == best_unit]
    assert f"top inputs {first.input.iloc[0]} {first.value.iloc[0]:.3g}" in next(
        line for line in lines if line.startswith(f"  unit {best_unit}:"))


def test_a_sample_without_a_name_is_refused_before_its_batch_runs(tmp_path):
    model, images = model_and_data()
    with runner.attach(model, hooks=["units"], overrides=["hooks.units.layers=[0]"], out_dir=tmp_path / "a",
                       names=FILES[:8]) as run:
        with pytest.raises(ConfigError, match=r"id 9 has no name in attach\(names=...\) \(its 8 names are ids 0..7\)"):
            run.samples([0, 9])
        with pytest.raises(ConfigError, match=r"2 names for 3 ids"):
            run.samples([0, 1, 2], names=["a", "b"])
        with pytest.raises(ConfigError, match=r"a str or a \(name, class\) pair, not 7"):
            run.samples([0], names=[7])
        run.samples([0, 1])  # ids with names: fine
        model(images[:2])
        run.step()


def test_top_units_reads_each_inputs_file_once_and_not_its_images(tmp_path, monkeypatch):
    """``unit_inputs.parquet`` holds every kept image; naming the top inputs needs its names (and a text
    sample's token ids) only: one read per file, without the ``input`` column."""
    import pyarrow.parquet as pq

    named_run(tmp_path / "run", "batch")
    reads = []
    opened, read_table = pq.ParquetFile, pq.read_table

    class Recording(opened):
        def __init__(self, source, *args, **kwargs):
            super().__init__(source, *args, **kwargs)
            self.source = str(source)

        def read(self, columns=None, *args, **kwargs):
            reads.append((self.source, columns))
            return super().read(columns, *args, **kwargs)

    def recording_read_table(source, *args, columns=None, **kwargs):
        reads.append((str(source), columns))
        return read_table(source, *args, columns=columns, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", Recording)
    monkeypatch.setattr(pq, "read_table", recording_read_table)
    table = top_units(tmp_path / "run", k=2)
    assert set(table.input) <= {name for name, _ in FILES}
    inputs = [columns for source, columns in reads if source.endswith("unit_inputs.parquet")]
    assert len(inputs) == 1 and inputs[0] is not None and "input" not in inputs[0] and "input_name" in inputs[0]
