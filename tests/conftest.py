"""Shared fixtures: configs composed with Hydra's compose API, runs into tmp_path, leak checks."""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

from common.errors import ConfigError

import runner.analysis as analysis
from runner.config.compose import compose_config
from runner.cli.execute import execute
from runner.engine import loop
from runner.engine.plan import compile_plan
from docs_text import blocks, section


def share_the_cores() -> None:
    """Under pytest-xdist, each worker's intra-op threads (torch's, and through ``OMP_NUM_THREADS`` its
    children's) are its share of the cores: with ``-n 2`` on two cores, two workers of two OpenMP threads
    each spin-wait for each other (tests/test_units.py took 90.8 s of CPU with two threads on a busy
    machine, 57.0 s with one). A run outside xdist, or an ``OMP_NUM_THREADS`` given, is left as it is."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


share_the_cores()


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` of a CLI child a test sends Ctrl-C (SIGINT): its default disposition, so Python turns
    it into ``KeyboardInterrupt`` even when pytest was started in the background of a shell without job
    control, which leaves SIGINT ignored (and Python keeps an ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: Each command line's config, composed once per test process (Hydra's compose costs about 0.1 s of CPU
#: and the tests ask for the same few hundred command lines thousands of times).
_COMPOSED: dict[tuple[str, ...], object] = {}


def make_config(*overrides: str):
    """The config ``python -m runner OVERRIDES`` would see (a Hydra-level mistake is a ``ConfigError``):
    a copy of its own for each caller, which may change it."""
    if overrides not in _COMPOSED:
        _COMPOSED[overrides] = compose_config(overrides)
    return copy.deepcopy(_COMPOSED[overrides])


def cli(overrides, out_dir) -> None:
    """What ``python -m runner OVERRIDES`` does, in-process: the command-line check, then ``execute``."""
    try:
        cfg = make_config(*overrides)
    except ConfigError as exc:  # printed by the command-line check before Hydra starts
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    execute(cfg, out_dir, overrides)


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str


def run_main(monkeypatch, capsys, *argv: str) -> Ran:
    """``python -m runner ARGV`` in this process (``runner.__main__.main``: the command-line check, then Hydra,
    a sweep's jobs one after another): its exit status and what it printed. Its one-line warning format is
    put back afterwards; warnings themselves are pytest's to record, so they are not in ``stderr``."""
    import warnings

    import runner.__main__ as main

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.setattr(sys, "argv", ["runner", *argv])
    capsys.readouterr()
    try:
        main.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    printed = capsys.readouterr()
    return Ran(code, printed.out, printed.err)


def built(kernel, what: str):
    """``kernel`` (a C kernel of ``hooks.kernels.native``, None where it is not built): a test that needs it is
    skipped on a machine without a C compiler or with the kernels switched off (``HOOK_RUNNER_NATIVE=0``:
    the default suite passes both ways) and fails on one whose compiler failed to build it."""
    from hooks.kernels import native

    if kernel is None and not native.enabled():
        pytest.skip(f"{native.SWITCH}=0: the {what} is switched off")
    if kernel is None and shutil.which(native.compiler_command()) is None:
        pytest.skip(f"no C compiler: the {what} cannot be built")
    assert kernel is not None, f"the {what} could not be built on this machine"
    return kernel


def run(cfg, out_dir, overrides=()) -> Path:
    """Compile ``cfg`` and run it into ``out_dir``, as the CLI does."""
    return loop.run(compile_plan(cfg, overrides), out_dir)


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from torch's seed 0: a float32 tolerance that holds once holds on every run,
    whichever worker and order xdist gives the test."""
    torch.manual_seed(0)


@pytest.fixture
def run_with(tmp_path):
    """Run the runner in-process with ``overrides``; return the run directory."""
    counter = iter(range(1000))

    def _run(*overrides: str) -> Path:
        out = tmp_path / f"run{next(counter)}"
        return run(make_config(*overrides), out, overrides)

    return _run


def stats_of(run_dir: Path, **where):
    """``stats.parquet`` rows whose columns equal ``where``."""
    df = analysis.load_stats(run_dir)
    for key, value in where.items():
        df = df[df[key] == value]
    return df.reset_index(drop=True)


def _entries(hooks: dict | None) -> tuple:
    return tuple((key, id(fn)) for key, fn in (hooks or {}).items())


def hook_snapshot(model: nn.Module | None = None) -> dict[str, tuple]:
    """Every hook dict PyTorch keeps, as ``{where: ((handle id, id(fn)), ...)}``.

    Covers each module's dicts (every attribute with ``hook`` in its name: forward, pre,
    kwargs, always-called, backward, state-dict ...), each parameter's tensor and
    post-accumulate-grad hooks, the global dicts of ``torch.nn.modules.module`` and the
    innermost open ``saved_tensors_hooks`` pair. Found by
    name, so dicts a later PyTorch adds are covered too. Comparing two snapshots tells whether
    anything was added, removed or replaced, also among hooks the runner does not own.
    """
    snap: dict[str, tuple] = {}
    if model is not None:
        for name, module in model.named_modules(remove_duplicate=False):
            for attr, value in vars(module).items():
                if "hook" in attr and isinstance(value, dict):
                    snap[f"module '{name}'.{attr}"] = _entries(value)
        for name, param in model.named_parameters(remove_duplicate=False):
            for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
                snap[f"parameter '{name}'.{attr}"] = _entries(getattr(param, attr, None))
    for attr, value in vars(module_globals).items():
        if attr.startswith("_global") and "hook" in attr and isinstance(value, dict):
            snap[f"torch.nn.modules.module.{attr}"] = _entries(value)
    saved = torch._C._autograd._top_saved_tensors_default_hooks(False)  # an open saved_tensors_hooks
    snap["torch.autograd.graph.saved_tensors_hooks"] = () if saved is None else tuple(map(id, saved))
    return snap


def hook_changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Where two snapshots differ, as ``where: before -> after`` lines (empty when equal)."""
    return [f"{k}: {before.get(k, ())} -> {after.get(k, ())}" for k in sorted(before.keys() | after.keys())
            if before.get(k, ()) != after.get(k, ())]


def hook_count(model: nn.Module) -> int:
    """How many hooks PyTorch keeps for ``model``: per module, per parameter and global."""
    return sum(len(v) for v in hook_snapshot(model).values())


class Watch:
    """The models the runner built during a test, each with the hooks it had when built."""

    def __init__(self) -> None:
        self.models: list[tuple[nn.Module, dict[str, tuple]]] = []
        self.globals = hook_snapshot()
        self.forwards = 0
        #: Called on each model right after it is built (e.g. to make a layer fail).
        self.prepare: Callable[[nn.Module], None] = lambda model: None

    def assert_untouched(self) -> None:
        """Every hook dict of every built model, and the global ones, are exactly as before."""
        for model, before in self.models:
            assert not hook_changes(before, hook_snapshot(model)), hook_changes(before, hook_snapshot(model))
        assert not hook_changes(self.globals, hook_snapshot())


@contextlib.contextmanager
def watching() -> Iterator[Watch]:
    """Within the block, ``runner.engine.loop.build_model`` gives each model a hook of its own (a user's
    hook that must survive the run; it counts forward passes) and records a snapshot of its hook
    dicts in the ``Watch`` it yields."""
    watched, build = Watch(), loop.build_model

    def count_forward(module, args) -> None:
        watched.forwards += 1

    def build_and_watch(cfg):
        model = build(cfg)
        watched.prepare(model)
        model.register_forward_pre_hook(count_forward)
        watched.models.append((model, hook_snapshot(model)))
        return model

    loop.build_model = build_and_watch
    try:
        yield watched
    finally:
        loop.build_model = build


@pytest.fixture
def watch():
    """``watching()`` for one test; at teardown every built model and the global hook dicts
    must be exactly as they were."""
    with watching() as watched:
        yield watched
    watched.assert_untouched()


def assert_no_partial_output(out: Path) -> None:
    """``out`` holds no parquet file, no manifest and no temporary file (or does not exist)."""
    if out.exists():
        left = sorted(p.name for p in out.iterdir()
                      if p.suffix == ".parquet" or p.name == "manifest.json" or ".tmp-" in p.name)
        assert not left, f"partial output left in {out}: {left}"


def seeded_batch(shape, seed: int = 0) -> torch.Tensor:
    """The first ``randn`` batch the runner draws for ``seed``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@dataclass
class Outcome:
    code: int
    stderr: str


@pytest.fixture
def fault(tmp_path, watch, capsys):
    """Run the CLI's ``execute`` on overrides (model=convnet unless a model is given) expecting it to
    exit; check the one-line message, the hook dicts, the forward count and that no partial output
    is left; return the exit status and the message."""

    def _run(*overrides: str, out: Path | None = None, forwards: int | None = 0) -> Outcome:
        overrides = overrides if any(o.startswith(("model=", "model.name=")) for o in overrides) \
            else ("model=convnet", *overrides)
        out = out or tmp_path / "out"
        with pytest.raises(SystemExit) as exit_:
            cli(overrides, out)
        stderr = capsys.readouterr().err.strip()
        assert len(stderr.splitlines()) == 1, stderr
        assert "Traceback" not in stderr
        watch.assert_untouched()
        if forwards is not None:
            assert watch.forwards == forwards
        assert_no_partial_output(out)
        return Outcome(exit_.value.code, stderr)

    return _run


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs with the given options under tmp_path (root only); unmounted after the test."""
    mounted = []

    def _mount(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): "
                        f"a read-only or full file system cannot be made without it")
        mounted.append(where)
        return where

    yield _mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


def docs_block(page: str, heading: str, language: str, index: int = 0) -> str:
    """The ``index``-th ``language`` code block under ``heading`` of a docs page (``docs_text.page``), as written."""
    return blocks(section(page, heading), language)[index]


def docs_code(page: str, heading: str, marker: str, language: str = "python") -> str:
    """The first ``language`` code block after ``marker`` under ``heading`` of a docs page, as written."""
    return section(page, heading).split(marker, 1)[1].split(f"```{language}\n", 1)[1].split("```", 1)[0]


def assert_same_tables(mine: Path, theirs: Path):
    """Two runs wrote the same rows: every column of ``stats.parquet`` (as ``runner.analysis`` reads it;
    the config columns differ by design) and of ``steps.parquet`` but the timings. Returns both stats frames."""
    import pandas as pd
    from runner.store.outputs import STATS_SCHEMA

    stats_mine, stats_theirs = analysis.load_stats(mine), analysis.load_stats(theirs)
    assert len(stats_mine) == len(stats_theirs) > 0
    pd.testing.assert_frame_equal(stats_mine[STATS_SCHEMA.names], stats_theirs[STATS_SCHEMA.names])
    timings = ["wall_time_s", "peak_memory_bytes"]
    pd.testing.assert_frame_equal(pd.read_parquet(Path(mine) / "steps.parquet").drop(columns=timings),
                                  pd.read_parquet(Path(theirs) / "steps.parquet").drop(columns=timings))
    return stats_mine, stats_theirs


def image_folder_of(root: Path, n: int, seed: int) -> str:
    """``n`` random 32x32 PNGs in two class folders under ``root`` (``data=imagefolder``); returns ``root``."""
    import numpy as np
    from PIL import Image

    gen = np.random.default_rng(seed)
    for i in range(n):
        folder = root / f"class{i % 2}"
        folder.mkdir(exist_ok=True)
        Image.fromarray(gen.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return str(root)
