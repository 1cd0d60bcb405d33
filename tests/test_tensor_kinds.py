"""Tensors that are not ordinary (sparse, nested, quantized, meta, a user's subclass) reaching stats, clip,
extract and units: recorded as the values they stand for, against plain PyTorch in float64, or one line
naming the layer and the kind. And the statistics kernel is asked to read only what it can."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import runner
import runner.analysis as analysis
from common.errors import ConfigError
from conftest import hook_count
from hooks.kernels import native
from hooks.mechanism.recorder import Recorder
from hooks.kernels.stats import reduce_tensor
from runner.analysis.units import load_units
from test_stats import assert_stats_close, summary_of

pytestmark = pytest.mark.statistics


class Then(nn.Module):
    """A ``Linear`` followed by ``fn`` of its output, as module ``m``."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.m = Lambda(fn)

    def forward(self, x):
        return self.m(self.fc(x))


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def quantized(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PyTorch's deprecation of quantized tensors
        return torch.quantize_per_tensor(x.detach(), 0.05, 0, torch.qint8)


def nested(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the prototype warning of strided nested tensors
        return torch.nested.nested_tensor([x[0], x[1, :2]])


class Counted(torch.Tensor):
    """A user's ``__torch_function__`` subclass that counts every operator run on it."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def record(model, x, tmp_path, hooks, overrides=(), backward=False):
    """One step of ``model(x)`` under ``runner.attach``; the output and the run directory."""
    out_dir = tmp_path / "run"
    with runner.attach(model, hooks=hooks, overrides=list(overrides), out_dir=str(out_dir)) as run:
        out = model(x)
        if backward:
            out.sum().backward()
        run.step()
    return out, out_dir


def row(out_dir, layer, kind="output"):
    df = analysis.load_stats(out_dir)
    df = df[(df.layer == layer) & (df.kind == kind)]
    assert len(df) == 1, df
    return df.iloc[0]


SPARSE = {
    "coo": lambda y: y.relu().to_sparse(),
    "csr": lambda y: y.relu().detach().to_sparse_csr(),
    "uncoalesced coo": lambda y: torch.sparse_coo_tensor(  # (0, 1) stored twice: the element is their sum
        torch.tensor([[0, 0, 2], [1, 1, 3]]), y.detach()[0, :3], y.shape),
}


@pytest.mark.parametrize("make", SPARSE.values(), ids=SPARSE.keys())
def test_a_sparse_output_is_recorded_as_the_dense_tensor_it_stands_for(tmp_path, make):
    torch.manual_seed(0)
    model = Then(make)
    x = torch.randn(4, 6)
    out, out_dir = record(model, x, tmp_path, ["stats"], ["hooks.stats.kinds=[output]"])
    got = row(out_dir, "m")
    assert_stats_close(got, out.to_dense())
    assert list(got.tensor_shape) == [4, 6] and got.numel == 24


def test_sparse_reductions_never_make_the_tensor_dense_and_keep_nan_in_the_range():
    values = torch.tensor([3.0, float("nan"), -2.0])
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 5, 9]]), values, (10,))
    got = summary_of(sparse)
    assert got["nan_count"] == 1 and np.isnan(got["min"]) and got["zero_frac"] == pytest.approx(0.7)
    empty = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.long), torch.zeros(0), (5,))
    assert summary_of(empty) == pytest.approx(summary_of(torch.zeros(5)), nan_ok=True)


def test_a_sparse_output_kept_by_extract_is_its_dense_values(tmp_path):
    torch.manual_seed(0)
    model = Then(SPARSE["coo"])
    out, out_dir = record(model, torch.randn(4, 6), tmp_path, ["extract"], ["hooks.extract.layers=[m]"])
    kept = analysis.load_tensors(out_dir)
    assert np.array_equal(kept[kept.layer == "m"].tensor.iloc[0], out.detach().to_dense().numpy())


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.fc = nn.Linear(4, 1)

    def forward(self, idx):
        return self.fc(self.emb(idx)).sum()


def test_a_sparse_gradient_is_clipped_and_recorded_as_plain_pytorch_gives_it(tmp_path):
    torch.manual_seed(0)
    model, plain = Embedded(), Embedded()
    plain.load_state_dict(model.state_dict())
    idx = torch.tensor([1, 3, 3, 7])
    plain(idx).backward()
    want = plain.emb.weight.grad.to_dense().clamp(-0.01, 0.01)
    _, out_dir = record(model, idx, tmp_path, ["clip"], ["hooks.clip.layers=[emb]"], backward=True)
    assert model.emb.weight.grad.layout == torch.sparse_coo
    assert torch.equal(model.emb.weight.grad.to_dense(), want)
    df = analysis.load_stats(out_dir)
    clipped = df[(df.kind == "param_grad") & (df.phase == "backward")].iloc[0]
    assert_stats_close(clipped, want)
    assert hook_count(model) == 0


def test_a_quantized_output_is_recorded_as_its_dequantized_values_with_its_dtype(tmp_path):
    torch.manual_seed(0)
    model = Then(quantized)
    out, out_dir = record(model, torch.randn(4, 6), tmp_path, ["stats", "units"],
                          ["hooks.stats.kinds=[output]", "hooks.units.layers=[m]"])
    got = row(out_dir, "m")
    assert got["dtype"] == "qint8"
    assert_stats_close(got, out.dequantize())
    units = load_units(out_dir)
    mine = units[units.layer == "m"].sort_values("unit")
    assert np.allclose(mine["mean"], out.dequantize().double().mean(0).numpy())


def test_a_nested_output_is_recorded_as_its_components_elements_and_units_refuse_it(tmp_path):
    torch.manual_seed(0)
    model = Then(nested)
    out, out_dir = record(model, torch.randn(4, 6), tmp_path, ["stats"], ["hooks.stats.kinds=[output]"])
    got = row(out_dir, "m")
    elements = torch.cat([c.reshape(-1) for c in out.unbind()])
    assert_stats_close(got, elements)
    assert list(got.tensor_shape) == [8]
    with pytest.raises(ConfigError, match=r"'m' output 0 is a nested tensor") as err:
        record(Then(nested), torch.randn(4, 6), tmp_path / "units", ["units"], ["hooks.units.layers=[m]"])
    assert "\n" not in str(err.value)


def test_an_edit_on_a_quantized_output_is_one_line_naming_the_layer(tmp_path):
    model = Then(quantized)
    with pytest.raises(ConfigError, match=r"hooks.ablate on 'm' output is a quantized tensor") as err:
        record(model, torch.randn(4, 6), tmp_path, ["ablate"], ["hooks.ablate.layers=[m]"])
    assert "\n" not in str(err.value) and hook_count(model) == 0


def test_a_meta_output_is_one_line_naming_the_layer_and_no_hook_stays(tmp_path):
    model = Then(lambda y: torch.empty_like(y, device="meta"))
    with pytest.raises(ConfigError, match=r"'m' output 0 is a meta tensor") as err:
        record(model, torch.randn(4, 6), tmp_path, ["stats"], ["hooks.stats.kinds=[output]"])
    assert "\n" not in str(err.value) and hook_count(model) == 0
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_a_torch_function_subclass_is_recorded_without_running_its_code(tmp_path):
    torch.manual_seed(0)
    model = Then(lambda y: y.as_subclass(Counted) * 2)
    out, out_dir = record(model, torch.randn(4, 6), tmp_path, ["stats", "clip"],
                          ["hooks.stats.kinds=[output]", "hooks.clip.layers=[fc]"], backward=True)
    assert_stats_close(row(out_dir, "m"), out.as_subclass(torch.Tensor))
    recorder = Recorder()
    t = torch.randn(64, 8).as_subclass(Counted)
    Counted.calls = 0
    recorder.record(t, hook="h", layer="m", phase="forward", kind="output", slot="0", call=0, keep=True)
    captures = recorder.drain()
    assert Counted.calls == 0  # not one operator of the subclass ran for the statistics or the copy
    assert captures.stats["max"][0] == t.as_subclass(torch.Tensor).max().item()


KINDS = {
    "sparse": torch.randn(4, 4).relu().to_sparse(),
    "csr": torch.randn(4, 4).relu().to_sparse().to_sparse_csr(),
    "quantized": quantized(torch.randn(8)),
    "nested": nested(torch.randn(4, 6)),
    "meta": torch.empty(8, device="meta"),
    "subclass": torch.randn(8).as_subclass(Counted),
    "int": torch.arange(8),
    "float16": torch.randn(8).half(),
    "strided view": torch.randn(8, 8)[:, ::2],
    "negated view": torch.complex(torch.ones(8), torch.ones(8)).conj().imag,
}


@pytest.mark.parametrize("name", KINDS)
def test_the_kernel_is_offered_only_plain_contiguous_float_cpu_tensors(name):
    assert native.readable(KINDS[name]) is False
    assert native.readable(torch.randn(8)) is True and native.readable(torch.randn(8, dtype=torch.float64)) is True


VALUES = {
    "sparse": lambda t: t.to_dense(),
    "csr": lambda t: t.to_dense(),
    "quantized": lambda t: t.dequantize(),
    "nested": lambda t: torch.cat([c.reshape(-1) for c in t.unbind()]),
    "subclass": lambda t: t.as_subclass(torch.Tensor),
}


@pytest.mark.parametrize("name", [name for name in KINDS if name != "meta"])
def test_reduce_tensor_reads_every_kind_that_has_values(name):
    t = KINDS[name]
    assert_stats_close(summary_of(t), VALUES.get(name, lambda t: t)(t))


def test_reduce_tensor_refuses_a_meta_tensor_in_one_line():
    with pytest.raises(ConfigError, match="is a meta tensor"):
        reduce_tensor(KINDS["meta"])


def test_reduce_tensor_on_the_plain_tensor_is_the_kernels_result():
    t = torch.randn(100)
    assert torch.equal(reduce_tensor(t), reduce_tensor(t.as_subclass(Counted).as_subclass(torch.Tensor)))
