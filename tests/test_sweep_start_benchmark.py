"""Smoke run of ``benchmarks.sweep_start`` at tiny sizes: each measurement times what it says.

Timings are not asserted (the machine is shared): that the first-step child stopped at job 0's
first step, and that the sweep and the loop ran the same runs.
"""
from __future__ import annotations

import math

import pytest

from benchmarks import sweep_start
from conftest import assert_same_tables


@pytest.mark.slow
def test_the_first_step_is_job_0s_and_the_sweep_and_the_loop_run_the_same_runs(tmp_path):
    first = sweep_start.first_step(tmp_path, blocks=1, positions=2)
    assert first.jobs == 2 and math.isfinite(first.wall_s) and first.wall_s > 0 and first.cpu_s > 0
    jobs = sorted(p.name for p in (tmp_path / "patching").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0"]  # stopped in job 0's first step: job 1 never started
    assert not (tmp_path / "patching" / "0" / "manifest.json").exists()

    sweep, loop = sweep_start.per_job(tmp_path, jobs=2)
    assert (sweep.jobs, loop.jobs) == (2, 2) and sweep.cpu_s > 0 and loop.cpu_s > 0
    for num in range(2):  # the loop's run of seed N is the sweep's job N
        assert_same_tables(tmp_path / "sweep" / str(num), tmp_path / "loop" / str(num))
