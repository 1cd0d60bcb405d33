"""The CPU statistics kernels (``stats_kernel.c``; ``units_kernel.c`` for ``units``): built once per
machine, loaded with ctypes.

Why a C kernel: every statistic of a tensor in one vectorised pass over memory. Eager PyTorch
needs a pass per statistic (and its boolean counts run at 1-2 GB/s on a ReLU's output);
``torch.compile``'s CPU kernel fuses them but ran at about 3 GB/s here, and its own OpenMP pool
fights PyTorch's on the same cores. ctypes releases the GIL while the kernel runs.

The build takes well under a second with the machine's C compiler (``$CC``, else ``cc``) and is
cached per source, flags and CPU (it is tuned with ``-march=native``, so a node with another
CPU builds its own) in ``$HOOK_RUNNER_CACHE`` or ``~/.cache/hook-runner``. Without a compiler
the statistics fall back to eager PyTorch, with one warning: the compiler is tried once per
process, not once per kernel or per run.

The kernels give the eager reductions' statistics on every input, NaN and Inf included (no
finite-math assumption anywhere: ``kernel_keys.h``). ``HOOK_RUNNER_NATIVE=0`` turns them off:
nothing is built and the eager PyTorch reductions run wherever a kernel would have.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from pathlib import Path

import torch

from common.durable import replaced
from common.errors import ConfigError

SOURCE = Path(__file__).with_name("stats_kernel.c")
UNITS_SOURCE = Path(__file__).with_name("units_kernel.c")
#: The header both kernels include: part of every build's cache key.
HEADER = Path(__file__).with_name("kernel_keys.h")
#: The switch: ``HOOK_RUNNER_NATIVE=0`` runs the eager PyTorch reductions wherever a kernel would run.
SWITCH = "HOOK_RUNNER_NATIVE"
SWITCH_VALUES = {"1": True, "0": False}

#: Reassociation lets the compiler vectorise the sums; no finite-math, so NaN and Inf compare as IEEE says.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-fPIC", "-shared")
#: Both kernels split their work over OpenMP threads (PyTorch's libgomp, loaded first: its pool); a compiler
#: without OpenMP builds them without, on one thread.
OPENMP = ("-fopenmp",)

_kernel = None  # the loaded ``hr_reduce``; False once the build failed
_units_kernel = None  # the loaded ``hr_units``; False once the build failed
_no_compiler = None  # the compiler command that could not be run: no kernel tries it again in this process


def enabled() -> bool:
    """Whether the C kernels may run: ``HOOK_RUNNER_NATIVE`` unset or 1; 0 turns them off (read on
    every call, so a process may switch). Any other value is refused in one line."""
    value = os.environ.get(SWITCH, "1").strip()
    if value not in SWITCH_VALUES:
        raise ConfigError(f"{SWITCH}={value!r}: valid: 1 (the C statistics kernels, the default) or 0 (eager "
                          f"PyTorch reductions)")
    return SWITCH_VALUES[value]


def cache_dir() -> Path:
    base = os.environ.get("HOOK_RUNNER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hook-runner")
    return Path(base)


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor()


def library_path(compiler: str, source: Path = SOURCE, extra: tuple[str, ...] = ()) -> Path:
    key = hashlib.sha256("\0".join([source.read_text(), HEADER.read_text(), compiler, *FLAGS, *extra, platform.machine(),
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    return cache_dir() / f"{source.stem}-{key}.so"


def build(compiler: str, target: Path, source: Path = SOURCE, extra: tuple[str, ...] = ()) -> None:
    """Compile into a temporary file and rename it into place (``common.durable.replaced``): jobs of a sweep
    may build at once, and a cache shared with colleagues holds files they can read."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with replaced(target) as tmp:
        subprocess.run([compiler, *FLAGS, *extra, "-o", str(tmp), str(source)], check=True, capture_output=True,
                       text=True)


def kernel():
    """The ``hr_reduce`` C function, built on first use; None where it cannot be built (one warning)
    or the switch is off."""
    global _kernel
    if not enabled():
        return None
    if _kernel is None:
        _kernel = _load(SOURCE, "hr_reduce", [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p],
                        (OPENMP, ()))
    return _kernel or None


def units_kernel():
    """The ``hr_units`` C function (``units_kernel.c`` says what it takes), built on first use; None
    where it cannot be built (one warning) or the switch is off: ``units`` then takes eager PyTorch passes."""
    global _units_kernel
    if not enabled():
        return None
    if _units_kernel is None:
        i64, f64, ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
        _units_kernel = _load(UNITS_SOURCE, "hr_units", [ptr, ctypes.c_int, i64, i64, i64, ptr, f64, f64, f64, i64,
                                                         i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr],
                              (OPENMP, ()))
    return _units_kernel or None


def compiler_command() -> str:
    """The C compiler the kernels are built with: ``$CC``, else ``cc`` or ``gcc`` on the path."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"


def _load(source: Path, symbol: str, argtypes: list, extras: tuple[tuple[str, ...], ...] = ((),)):
    """``symbol`` of ``source`` built (or found in the cache) and loaded, with the first of ``extras`` (flags
    beyond ``FLAGS``) the compiler accepts; False, with one warning, where it cannot be built. A compiler
    that could not be run at all is not run again for the other kernel: one warning in all."""
    global _no_compiler
    compiler = compiler_command()
    if compiler == _no_compiler:
        return False
    try:
        for i, extra in enumerate(extras):
            path = library_path(compiler, source, extra)
            try:
                if not path.exists():
                    build(compiler, path, source, extra)
                break
            except subprocess.CalledProcessError:
                if i == len(extras) - 1:
                    raise
        fn = getattr(ctypes.CDLL(str(path)), symbol)
        fn.argtypes = argtypes
        fn.restype = None
        return fn
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip().splitlines()[-1] if getattr(exc, "stderr", None) else exc
        if isinstance(exc, OSError) and exc.filename == compiler:
            _no_compiler = compiler
            what = "the C statistics kernels could not be built"
        else:
            what = f"the {source.stem.replace('_', ' ')} could not be built"
        warnings.warn(f"{what} ({detail}); statistics use eager PyTorch reductions, which are slower "
                      f"({SWITCH}=0 skips the build)", RuntimeWarning, stacklevel=3)
        return False


def readable(flat: torch.Tensor) -> bool:
    """Whether the kernel may read ``flat`` through ``data_ptr``: the one place that decides, and it
    says yes only to a plain, strided, contiguous float32/float64 CPU tensor with no lazy negation or
    conjugation bit (``hooks.kernels.stats.reduce_real`` has refused a tensor whose storage was freed under it:
    FSDP2 resizes an unsharded parameter's storage to zero between uses).

    Every other tensor takes the eager reductions: tensor subclasses (``DTensor`` and other wrappers
    without storage of their own), sparse, nested, quantized and meta tensors (``hooks.kernels.tensor_kinds``
    turns them into what is read before they get here), other devices and dtypes.
    """
    if type(flat) is not torch.Tensor and type(flat) is not torch.nn.Parameter:
        return False
    return not (flat.layout != torch.strided or flat.is_nested or flat.is_quantized or flat.device.type != "cpu"
                or flat.dtype not in (torch.float32, torch.float64) or not flat.is_contiguous()
                or flat.is_neg() or flat.is_conj())


def reduce_contiguous(flat: torch.Tensor) -> torch.Tensor:
    """``hooks.kernels.stats.RAW`` of a contiguous, non-empty float32/float64 CPU tensor, in one pass.

    A tensor of more than one chunk (65,536 elements) is split over PyTorch's own OpenMP threads, the
    workers that keep spinning after each operator: a thread of our own competing with them had made
    ``stats`` slower (1.17 of bare against 1.08 on one thread), the pool's own workers made a 6.4 M
    element reduction 2.2 times faster on 2 cores. Chunks are added in order, so the result does not
    depend on the number of threads. The caller checks that ``kernel()`` is available.
    """
    out = torch.empty(9, dtype=torch.float64)
    _kernel(flat.data_ptr(), flat.numel(), flat.dtype == torch.float64, out.data_ptr())
    return out
