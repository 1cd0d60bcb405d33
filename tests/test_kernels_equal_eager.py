"""The C kernels (``hooks/kernels/stats_kernel.c``, ``hooks/kernels/units_kernel.c``) against the eager PyTorch passes:
the same statistics on every input, NaN and Inf included; ``HOOK_RUNNER_NATIVE=0`` turns the kernels
off; without a C compiler the statistics fall back to the eager passes, trying the compiler once."""
from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import built, make_config, run, stats_of
from hooks.kernels import native
from hooks.kernels.stats import eager_reductions, reduce_tensor, summarize
from hooks.kernels.unit_stats import SketchGrid, UnitStats
from runner.analysis.units import load_units

pytestmark = pytest.mark.statistics

NAN, INF = math.nan, math.inf
#: What is put into random batches: NaN, both infinities, both zeros, float32's extremes, a subnormal.
SPECIALS = (NAN, INF, -INF, 0.0, -0.0, 3.0e38, -3.0e38, 1e-40)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
TENSORS = ("top_value", "bottom_value", "min", "max")  # the kernel's floats that must equal the eager ones exactly
INDICES = ("count", "above", "sketch", "top_sample", "top_position", "bottom_sample", "bottom_position")
REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def eager_only():
    """The eager passes, as on a machine whose C compiler failed: the loaded kernels set aside."""
    saved = native._kernel, native._units_kernel
    native._kernel = native._units_kernel = False
    try:
        yield
    finally:
        native._kernel, native._units_kernel = saved


@st.composite
def poisoned(draw, shape):
    """A random tensor of ``shape`` in one of ``DTYPES`` at one of three scales, with up to 6 ``SPECIALS`` put in."""
    seed = draw(st.integers(0, 2 ** 31 - 1))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    flat = x.view(-1)
    for i, value in draw(st.lists(st.tuples(st.integers(0, flat.numel() - 1), st.sampled_from(SPECIALS)), max_size=6)):
        flat[i] = value
    return x.to(draw(st.sampled_from(DTYPES)))


def assert_same(got: torch.Tensor, want: torch.Tensor, scale: float, rtol: float, what: str) -> None:
    """Equal NaN for NaN, equal infinities, the rest within ``rtol`` (and ``rtol * scale`` absolute)."""
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True, msg=lambda m: f"{what}: {m}")


def finite_scale(x: torch.Tensor) -> float:
    """The largest finite magnitude in ``x`` (1 where none): what the sums' rounding is relative to."""
    finite = x.double()[x.double().isfinite()]
    return float(finite.abs().max()) if finite.numel() else 1.0


def unit_state(batches: list[torch.Tensor], positions: int) -> dict:
    stats = UnitStats(batches[0].shape[1], 3, 0.25, SketchGrid(0.01, 1e-6, 1e6), False, [positions])
    for i, x in enumerate(batches):
        stats.update(x, torch.arange(i * len(x), (i + 1) * len(x)))
    return stats.state()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), batch=st.integers(1, 5), units=st.integers(1, 3), positions=st.sampled_from([1, 7, 300, 600]))
def test_units_kernel_equals_the_eager_passes_on_batches_with_nan_and_inf(data, batch, units, positions):
    """Every accumulator of ``units``, kernel against eager, over two batches (so a NaN or Inf also
    meets the merge): min, max, the top-k / bottom-k values, samples and positions, the sketch and
    the count above equal; mean and M2 equal to float64 rounding (a NaN or Inf where the other has it)."""
    batches = [data.draw(poisoned((batch, units, positions))) for _ in range(2)]
    built(native.units_kernel(), "units kernel")
    kernel = unit_state(batches, positions)
    with eager_only():
        eager = unit_state(batches, positions)
    scale = finite_scale(torch.cat([x.reshape(-1) for x in batches]))
    for key in TENSORS:
        assert_same(kernel[key], eager[key], 0.0, 0.0, key)
    for key in INDICES:
        assert torch.equal(torch.as_tensor(kernel[key]), torch.as_tensor(eager[key])), key
    assert_same(kernel["mean"], eager["mean"], scale, 1e-9, "mean")
    assert_same(kernel["m2"], eager["m2"], scale * scale * kernel["count"], 1e-9, "m2")


def summary(x: torch.Tensor) -> dict[str, np.ndarray]:
    return summarize(reduce_tensor(x).numpy()[None], np.array([x.numel()]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), n=st.sampled_from([1, 2, 255, 257, 1000, 4100]))
def test_stats_kernel_equals_the_eager_passes_on_tensors_with_nan_and_inf(data, n):
    """Every column of ``stats``, kernel against eager: min, max, zero_frac and the NaN and Inf counts equal;
    mean, std, abs_mean and l2 equal to float32 summation rounding (a NaN or Inf where the other has it).
    4,100 elements: the eager passes then sum float32 in float32 (below 4,096 in float64)."""
    x = data.draw(poisoned((n,)))
    built(native.kernel(), "statistics kernel")
    kernel = summary(x)
    with eager_only():
        eager = summary(x)
    scale = finite_scale(x)
    for key in ("min", "max", "zero_frac", "nan_count", "inf_count"):
        assert_same(torch.as_tensor(kernel[key]), torch.as_tensor(eager[key]), 0.0, 0.0, key)
    for key in ("mean", "std", "abs_mean", "l2"):
        assert_same(torch.as_tensor(kernel[key]), torch.as_tensor(eager[key]), scale, 1e-5, key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("poison", ["none", "nan in the last chunk", "-inf in the second", "zeros in the first"])
def test_a_tensor_of_many_chunks_gives_one_result_on_any_number_of_threads_equal_to_float64(dtype, poison):
    """Past 65,536 elements the kernel splits a tensor over PyTorch's OpenMP threads: bit for bit the same
    statistics on 1 and 2 threads, equal to float64 PyTorch (NaN and Inf in one chunk reach the whole)."""
    built(native.kernel(), "statistics kernel")
    library = native.library_path(native.compiler_command(), native.SOURCE, native.OPENMP)
    assert b"GOMP_parallel" in library.read_bytes(), "the kernel was built without OpenMP: one thread only"
    torch.manual_seed(0)
    x = (torch.randn(3 * 65536 + 1001, dtype=torch.float64) * 2 + 0.5).to(dtype)
    if poison == "nan in the last chunk":
        x[-3] = math.nan
    elif poison == "-inf in the second":
        x[70000] = -math.inf
    elif poison == "zeros in the first":
        x[:5000] = 0.0
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(native.reduce_contiguous(x))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0].nan_to_num(7.0), results[1].nan_to_num(7.0))
    got = summarize(results[0].numpy()[None], np.array([x.numel()]))
    ref = x.double()
    finite = ref[ref.isfinite()]
    assert got["nan_count"][0] == ref.isnan().sum().item() and got["inf_count"][0] == ref.isinf().sum().item()
    assert got["zero_frac"][0] == (ref == 0).double().mean().item()
    if poison == "nan in the last chunk":
        assert math.isnan(got["min"][0]) and math.isnan(got["max"][0]) and math.isnan(got["mean"][0])
    elif poison == "-inf in the second":
        assert got["min"][0] == -math.inf and got["max"][0] == finite.max().item() and got["mean"][0] == -math.inf
    else:
        assert (got["min"][0], got["max"][0]) == (ref.min().item(), ref.max().item())
        rel = 1e-8 if dtype == torch.float32 else 1e-12  # float32 blocks are summed in float32 (256 elements)
        assert got["mean"][0] == pytest.approx(ref.mean().item(), rel=rel, abs=rel)
        assert got["std"][0] == pytest.approx(ref.std().item(), rel=rel)  # summarize: the sample std


@pytest.mark.parametrize("n", [2, 4100])
def test_magnitudes_whose_float32_squares_underflow_have_the_float64_spread_on_both_paths(n):
    """Float32 squares of magnitudes below 2^-60 lose their digits (below 2^-75 they vanish): both paths
    sum such tensors in float64 (the kernel per block). The kernel's float32 block sums gave std 0 here."""
    x = torch.zeros(n)
    x[1::2] = 1e-40
    built(native.kernel(), "statistics kernel")
    kernel = summary(x)
    with eager_only():
        eager = summary(x)
    want = x.double().std().item()
    for got in (kernel, eager):
        assert got["std"][0] == pytest.approx(want, rel=1e-6, abs=0)
        assert got["l2"][0] == pytest.approx(x.double().norm().item(), rel=1e-6, abs=0)


def test_float32_sums_that_overflow_beside_an_infinity_give_float64_s_infinity_on_both_paths():
    """Two values of 3e38 overflow a float32 sum, which then meets -inf: NaN, where float64 (and the
    kernel, whose blocks holding an infinity are summed in float64) gives -inf. The eager float32 sums
    of 4,096 elements or more are taken again in float64 whenever they are not finite."""
    x = torch.randn(4100, generator=torch.Generator().manual_seed(0)) * 1e-3
    x[[1, 2, 9]] = torch.tensor([3e38, -INF, 3e38])
    built(native.kernel(), "statistics kernel")
    want = x.double().mean().item()
    assert want == -INF
    for raw in (reduce_tensor(x), eager_reductions(x)):
        assert summarize(raw.numpy()[None], np.array([x.numel()]))["mean"][0] == want


def test_a_row_with_one_nan_has_nan_extremes_at_the_nan_and_leads_the_top_k_as_in_pytorch():
    """The issue's case: one NaN in a conv-sized batch. PyTorch's ``max(dim)`` and ``min(dim)`` give NaN at the
    first NaN, and ``topk`` ranks NaN above every number; the kernel gave the row's finite extremes."""
    x = torch.randn(8, 4, 300, generator=torch.Generator().manual_seed(1))
    x[5, 2, 260] = NAN
    built(native.units_kernel(), "units kernel")
    state = unit_state([x], 300)
    assert math.isnan(state["min"][2]) and math.isnan(state["max"][2])
    assert (state["top_sample"][0, 2], state["top_position"][0, 2]) == (5, 260) and math.isnan(state["top_value"][0, 2])
    want = torch.topk(x[:, 2].amax(1), 3)
    assert state["top_sample"][:, 2].tolist() == want.indices.tolist()
    assert 5 not in state["bottom_sample"][:, 2].tolist()  # NaN ranks above every number: never among the smallest
    assert torch.equal(state["min"][[0, 1, 3]], x.double().transpose(0, 1).reshape(4, -1).amin(1)[[0, 1, 3]])


def test_a_zero_minimum_is_at_the_first_zero_of_either_sign():
    """The kernel orders -0.0 below 0.0 internally; the position it reports is still PyTorch's, the first zero."""
    x = torch.ones(1, 1, 600)
    x[0, 0, 10], x[0, 0, 400] = 0.0, -0.0  # in different blocks of 256
    built(native.units_kernel(), "units kernel")
    kernel = unit_state([x], 600)
    with eager_only():
        eager = unit_state([x], 600)
    assert kernel["bottom_position"].item() == eager["bottom_position"].item() == 10


def test_float64_values_whose_squares_overflow_give_a_non_finite_spread_on_both_paths():
    """Where the kernels and the eager passes differ (the README says it): float64 values beyond about 1e154,
    whose squares pass float64's range. std and l2 (``stats``) and M2 (``units``) are then not finite on
    either path, but one may say inf where the other says NaN; the mean, min, max and counts still agree."""
    x = torch.tensor([1e300, -1e300, 1e300] * 100, dtype=torch.float64)
    built(native.kernel(), "statistics kernel")
    kernel = summary(x)
    with eager_only():
        eager = summary(x)
    for key in ("mean", "min", "max", "zero_frac", "nan_count", "inf_count"):
        np.testing.assert_allclose(kernel[key], eager[key], rtol=1e-12)
    assert (kernel["l2"][0], math.isnan(eager["l2"][0])) == (INF, True)  # pinned: fix both, then this line
    assert not np.isfinite(kernel["std"][0]) and not np.isfinite(eager["std"][0])
    built(native.units_kernel(), "units kernel")
    maps = x.view(3, 1, 100)
    kernel = unit_state([maps], 100)
    with eager_only():
        eager = unit_state([maps], 100)
    assert not kernel["m2"].isfinite().any() and not eager["m2"].isfinite().any()
    assert torch.equal(kernel["max"], eager["max"]) and torch.equal(kernel["top_position"], eager["top_position"])


class Poisoned(nn.Module):
    """A conv layer whose output holds one NaN (sample 1), one +Inf (sample 2) and one -Inf (sample 3) in a
    map of 16 x 16 positions, and a linear head over it: ``units`` and ``stats`` both see them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.poison = Poison()
        self.head = nn.Linear(4 * 16 * 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.poison(self.conv(x)).flatten(1))


class Poison(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[1, 0, 4, 5], x[2, 1, 0, 0], x[3, 2, 15, 15] = NAN, INF, -INF
        return x


RUN = ("model=custom", f"model._target_={__name__}.Poisoned", "data=randn", "data.shape=[6,3,16,16]",
       "mode=eval", "loss=none", "steps=2", "hooks=[units,stats]", "hooks.units.layers=[conv,poison]",
       "hooks.stats.layers=[conv,poison,head]", "hooks.stats.kinds=[output]", "on_nonfinite=ignore", "progress=false")


def test_a_units_and_stats_run_with_the_kernels_off_equals_the_run_with_them_on(tmp_path, monkeypatch):
    """``HOOK_RUNNER_NATIVE=0``: no kernel runs (they would fail the test) and every statistic of a run
    whose layers hold NaN and Inf equals the kernels' run."""
    built(native.kernel(), "statistics kernel")
    built(native.units_kernel(), "units kernel")
    on = run(make_config(*RUN), tmp_path / "on")
    monkeypatch.setenv("HOOK_RUNNER_NATIVE", "0")
    monkeypatch.setattr(native, "_kernel", lambda *a: pytest.fail("the stats kernel ran with HOOK_RUNNER_NATIVE=0"))
    monkeypatch.setattr(native, "_units_kernel", lambda *a: pytest.fail("the units kernel ran with HOOK_RUNNER_NATIVE=0"))
    off = run(make_config(*RUN), tmp_path / "off")
    units_on, units_off = load_units(on), load_units(off)
    assert len(units_on) == 8 and units_on["max"].isna().sum() == 1  # the NaN unit (poison, unit 0)
    for column in units_on.columns:
        if column == "run_dir":
            continue
        for a, b in zip(units_on[column], units_off[column]):
            if column in ("mean", "variance", "m2", "std"):  # float64 sums in another order
                assert b == pytest.approx(a, rel=1e-9, nan_ok=True), column
            else:
                np.testing.assert_array_equal(a, b, err_msg=column)
    stats_on, stats_off = stats_of(on), stats_of(off)
    assert len(stats_on) == len(stats_off) == 6
    assert stats_on[stats_on.layer == "poison"][["nan_count", "inf_count"]].values.tolist() == [[1, 2], [1, 2]]
    for column in ("min", "max", "zero_frac", "nan_count", "inf_count", "mean", "std", "abs_mean", "l2"):
        np.testing.assert_allclose(stats_on[column], stats_off[column], rtol=1e-5, err_msg=column)


def test_the_switch_refuses_another_value_in_one_line(monkeypatch):
    monkeypatch.setenv("HOOK_RUNNER_NATIVE", "off")
    with pytest.raises(ValueError, match=r"^HOOK_RUNNER_NATIVE='off': valid: 1 .* or 0 .*$"):
        native.kernel()


def test_a_missing_compiler_is_tried_once_per_process_with_one_warning(monkeypatch, tmp_path):
    """Both kernels fall back to the eager passes after one attempt to run the compiler and one warning,
    which names the switch that skips the build."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv(native.SWITCH, "1")  # the build is tried: the suite may run with the kernels off
    monkeypatch.setenv("HOOK_RUNNER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_kernel", None)
    monkeypatch.setattr(native, "_units_kernel", None)
    calls = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(2, 3, 5)
        x[0, 1, 2] = NAN
        assert native.kernel() is None and native.units_kernel() is None
        reduce_tensor(x)
        unit_state([x], 5)
    assert len(calls) == 1
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
        f"the C statistics kernels could not be built ([Errno 2] No such file or directory: '{tmp_path / 'no-such-cc'}'); "
        f"statistics use eager PyTorch reductions, which are slower (HOOK_RUNNER_NATIVE=0 skips the build)"]


COMPILER = re.compile(r"^(.*-)?(cc|gcc|g\+\+|c\+\+|clang|clang\+\+|tcc|icx|icpx)(-[\d.]+)?$")


def without_compilers(tmp_path: Path) -> str:
    """A PATH like this one with every C and C++ compiler left out (links to the rest)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if not COMPILER.match(name) and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(Path(directory) / name)
    return str(bin_dir)


@pytest.mark.slow
def test_the_stats_tests_pass_on_a_machine_without_any_c_or_cpp_compiler(tmp_path):
    """``tests/test_stats.py`` in a process that finds no C or C++ compiler (``CC`` names a missing one,
    ``PATH`` holds none, an empty kernel cache): they pass, the tests of a kernel or of ``torch.compile``
    skipped, every other one on the eager passes. The statistics' compiled (CUDA-path) reductions need
    the C++ compiler too; the rest of the kernels' tests need only ``CC``, which the README's no-compiler
    pass (``-m statistics``) takes away."""
    path = without_compilers(tmp_path)
    env = {**os.environ, "PATH": path, "CC": str(tmp_path / "no-cc"), "HOOK_RUNNER_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("CXX", None)
    assert shutil.which("gcc", path=path) is None and shutil.which("g++", path=path) is None
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_stats.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\d+ passed", done.stdout) and not list((tmp_path / "cache").glob("*.so"))
