"""A long-lived process (a notebook, a script of many experiments): ``runner.attach`` blocks and
CLI-equivalent runs (``loop.run(compile_plan(cfg))``) one after another, some failing half-way.

After each block: the user's model has the hooks it had, no code of ours runs in a plain model's
forward and backward (no global module hook, no saved-tensor hooks left active: watched with
``sys.setprofile``), the tables are identical to the first block's, and the memory does not grow:
live tensors and modules (``gc``) and the process's RSS. The default tests run a handful of
blocks; ``-m soak`` runs 1,000 attach blocks and 100 CLI runs and holds RSS (after ``malloc_trim``) and live tensors to
under 1 % growth after the first 300 blocks and the first 50 runs.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import os
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import runner
from conftest import hook_snapshot, make_config, run
from project_code import project_file
from runner.engine import loop

CLI_OVERRIDES = ["model=mlp", "hooks=[clip,stats]", "steps=2"]


class HalfWay(RuntimeError):
    """Raised inside a block, after the first step: a run that failed half-way."""


def rss() -> int:
    """The process's resident set, in bytes, after a collection and glibc's ``malloc_trim(0)``: freed heap
    pages go back to the system first, so a step of the allocator's own (CI saw +15 MiB once between blocks
    300 and 400, flat after, with the Python heap flat under tracemalloc) is not read as growth; memory still
    held is."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), kind))  # type(): no __class__ property runs


def our_calls() -> collections.Counter:
    """Python functions of the project's packages that run in a fresh model's forward and backward."""
    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and project_file(frame.f_code.co_filename):
            calls[(frame.f_code.co_filename, frame.f_code.co_name)] += 1

    model, x = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(5, 3, requires_grad=True)
    sys.setprofile(profile)
    try:
        model(x).pow(2).sum().backward()
    finally:
        sys.setprofile(None)
    return calls


def attach_block(model: nn.Module, x: torch.Tensor, out: Path, fail: bool) -> pq.Table | None:
    """Two recorded steps (or one, then ``HalfWay``); the stats table, ``None`` for a failed block."""
    try:
        with runner.attach(model, hooks=["clip", "stats"], out_dir=out) as attached:
            for step in range(2):
                loss = model(x).pow(2).mean()
                loss.backward()
                model.zero_grad()
                if fail and step == 1:
                    raise HalfWay("the user's loop failed")
                attached.step(loss)
    except HalfWay:
        assert not (out / "manifest.json").exists()
        return None
    return pq.read_table(out / "stats.parquet")


def cli_run(out: Path, fail: bool, monkeypatch) -> pq.Table | None:
    """``python -m runner`` in-process; a failing one raises inside its model's forward at step 1."""
    if not fail:
        return pq.read_table(run(make_config(*CLI_OVERRIDES), out, CLI_OVERRIDES) / "stats.parquet")
    calls = iter(range(10))

    def fails_at_the_second_step(module, args):
        if next(calls) == 1:
            raise HalfWay("the model failed")

    build = loop.build_model
    monkeypatch.setattr(loop, "build_model",
                        lambda cfg: _with_pre_hook(build(cfg), fails_at_the_second_step))
    try:
        with pytest.raises(HalfWay):
            run(make_config(*CLI_OVERRIDES), out, CLI_OVERRIDES)
    finally:
        monkeypatch.setattr(loop, "build_model", build)
    assert not (out / "manifest.json").exists()
    return None


def _with_pre_hook(model: nn.Module, hook) -> nn.Module:
    model.register_forward_pre_hook(hook)
    return model


def repeat(blocks: int, one, tmp_path: Path, measure_from: int) -> dict:
    """Run ``one(out, fail)`` ``blocks`` times (every third fails half-way); check each as it ends;
    return RSS and live tensors and modules at block ``measure_from`` and at the end."""
    first, at = None, {}
    plain = our_calls()
    assert not plain
    for i in range(blocks):
        out = tmp_path / f"block{i}"
        table = one(out, i % 3 == 2)
        if table is not None:
            first = first or table
            assert table.equals(first), f"block {i}'s table differs from the first block's"
        shutil.rmtree(out, ignore_errors=True)
        assert not our_calls(), f"our code runs in a plain model's passes after block {i}"
        if i + 1 in (measure_from, blocks):
            at[i + 1] = {"rss": rss(), "tensors": live(torch.Tensor), "modules": live(nn.Module)}
    return at


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.randn(4, 8)


def check_attach(blocks: int, measure_from: int, tmp_path: Path, model_and_input) -> dict:
    model, x = model_and_input
    before = hook_snapshot(model)
    at = repeat(blocks, lambda out, fail: attach_block(model, x, out, fail), tmp_path, measure_from)
    assert hook_snapshot(model) == before
    return at


def grown(at: dict, start: int, end: int) -> None:
    """No more live tensors or modules after block ``end`` than after block ``start``. Fewer is no leak:
    the count is the whole process's, and an earlier test's objects in this worker may be freed meanwhile
    (CI saw 2613 -> 2603)."""
    for kind in ("tensors", "modules"):
        assert at[end][kind] <= at[start][kind], (kind, at)


def test_attach_blocks_one_after_another_leave_nothing_behind(tmp_path, model_and_input):
    at = check_attach(6, 3, tmp_path, model_and_input)
    grown(at, 3, 6)


@pytest.mark.slow
def test_cli_runs_one_after_another_leave_nothing_behind(tmp_path, monkeypatch):
    at = repeat(4, lambda out, fail: cli_run(out, fail, monkeypatch), tmp_path, 1)
    grown(at, 1, 4)


def within_one_percent(at: dict, start: int, end: int) -> None:
    for measure in ("rss", "tensors"):
        assert at[end][measure] <= at[start][measure] * 1.01, (measure, at)
    print(f"RSS {at[start]['rss'] / 2**20:.1f} MiB after block {start}, {at[end]['rss'] / 2**20:.1f} MiB after "
          f"block {end}; live tensors {at[start]['tensors']} -> {at[end]['tensors']}")


@pytest.mark.soak
def test_a_thousand_attach_blocks_hold_no_growing_memory(tmp_path, model_and_input):
    """Measured from block 300, RSS read after ``malloc_trim`` (``rss``): 788.7-788.9 MiB at every 50th block
    from 50 to 1,000 on 2026-12-07, gc-tracked objects 405,995 throughout; untrimmed, CI once read
    1,117.9 -> 1,129.2 MiB (+1.02 %) from one allocator step. A leak of 12 KB a block still fails it."""
    within_one_percent(check_attach(1000, 300, tmp_path, model_and_input), 300, 1000)


@pytest.mark.soak
def test_a_hundred_cli_runs_hold_no_growing_memory(tmp_path, monkeypatch):
    within_one_percent(repeat(100, lambda out, fail: cli_run(out, fail, monkeypatch), tmp_path, 50), 50, 100)
