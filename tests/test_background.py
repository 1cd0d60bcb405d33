"""The background writer: order, bounded queue, errors, discard; and per-step peak memory."""
from __future__ import annotations

import errno
import threading
import time

import numpy as np
import pytest
import torch

import runner.analysis as analysis
from runner.store.background import BackgroundWriter
from runner.store.errors import OutputError
from runner.engine.memory import PeakMemory


def test_jobs_run_in_submission_order_and_close_waits_for_them():
    done = []
    writer = BackgroundWriter()
    for i in range(50):
        writer.submit(lambda i=i: done.append(i), nbytes=10)
    writer.close()
    assert done == list(range(50))


def test_submit_waits_while_the_queue_holds_more_than_its_bound():
    release = threading.Event()
    writer = BackgroundWriter(max_bytes=100)
    writer.submit(release.wait, nbytes=80)           # occupies the thread, holds 80 bytes
    second = threading.Thread(target=writer.submit, args=(lambda: None,), kwargs={"nbytes": 50})
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()                         # 80 + 50 > 100: the producer waits
    release.set()
    second.join(timeout=10)
    assert not second.is_alive()
    writer.close()


def test_a_failed_job_is_raised_to_the_producer_and_later_jobs_are_skipped():
    done = []
    writer = BackgroundWriter()
    writer.submit(lambda: 1 / 0)
    writer.submit(lambda: done.append("after"))
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as info:
        writer.close()
    assert isinstance(info.value.__cause__, ZeroDivisionError) and done == []


def test_an_output_error_is_raised_as_itself_from_submit_and_close():
    def full():
        raise OutputError(errno.ENOSPC, "cannot write 'run/stats.parquet': No space left on device")

    for when in ("submit", "close"):
        release = threading.Event()
        writer = BackgroundWriter()
        writer.submit(lambda: release.wait() and full())
        release.set()
        with pytest.raises(OutputError) as info:
            if when == "submit":
                while True:  # the error reaches the next submit once the job has run
                    writer.submit(release.wait)
            writer.close()
        assert str(info.value) == "cannot write 'run/stats.parquet': No space left on device"
        writer.close(discard=True)


def test_discard_drops_queued_jobs():
    release, done = threading.Event(), []
    writer = BackgroundWriter()
    writer.submit(release.wait)
    writer.submit(lambda: done.append("queued"))
    closer = threading.Thread(target=writer.close, kwargs={"discard": True})
    closer.start()
    release.set()
    closer.join(timeout=10)
    assert done == []


def test_peak_memory_sees_a_step_that_allocates_and_resets_after_it():
    peak = PeakMemory(torch.device("cpu"))
    peak.reset()
    block = np.ones(40_000_000)                      # 320 MB, touched
    with_block = peak.peak_bytes()
    del block
    peak.reset()
    assert with_block - peak.peak_bytes() > 200e6


def test_steps_parquet_records_each_steps_wall_time_and_peak_memory(run_with, watch, monkeypatch):
    """Step 2's forward allocates 320 MB and takes 1000 s more (on the run's clock): step 2's row, and
    not its neighbours', says so. Step 0 is left out of the memory comparison: a process's first step also
    holds what first calls allocate once (in a test worker that ran other files before, up to ~170 MB)."""
    clock, skipped, forwards = time.perf_counter, [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + skipped[0])

    def slow_and_big_step_2(module, args):
        if args[0].device.type != "meta":
            forwards.append(len(forwards))
            if forwards[-1] == 2:
                np.ones(40_000_000)  # touched, freed before the step ends
                skipped[0] += 1000.0

    watch.prepare = lambda model: model.register_forward_pre_hook(slow_and_big_step_2)
    steps = analysis.load_steps(run_with("model=convnet", "hooks=stats", "steps=4"))
    assert forwards == [0, 1, 2, 3]
    wall, peak = steps.wall_time_s.tolist(), steps.peak_memory_bytes.tolist()
    assert wall[2] >= 1000.0 > max(wall[0], wall[1], wall[3])
    assert peak[2] - max(peak[1], peak[3]) > 200e6
