"""The README's "Supported platforms", on this Linux machine standing in for the others.

macOS has no ``/proc``: with every ``/proc`` read failing (the run-directory claim's process table,
boot id and PID namespace; the step's peak memory), a run still commits, its peak memory comes from
``ru_maxrss``, and the claim still tells a dead owner (taken over) from a live one (refused) by
``os.kill(pid, 0)``. (A machine without a C compiler: ``tests/test_kernels_equal_eager.py``; Windows,
refused in one line: ``tests/test_docs.py``.)
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch

import runner
import runner.analysis as analysis
from common.errors import OutputError
from runner.engine import memory
from common import claim_record
from common.records import LOCK


@pytest.fixture
def no_proc(monkeypatch, tmp_path):
    """Every ``/proc`` path the runner reads is missing, as on macOS."""
    read = claim_record._read_text
    monkeypatch.setattr(claim_record, "_read_text", lambda path: None if path.startswith("/proc/") else read(path))
    monkeypatch.setattr(claim_record, "_pid_namespace", lambda: None)
    monkeypatch.setattr(memory, "_STATUS", str(tmp_path / "no-proc" / "status"))
    monkeypatch.setattr(memory, "_CLEAR_REFS", str(tmp_path / "no-proc" / "clear_refs"))


def _run(out_dir) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with runner.attach(model, hooks=["stats"], out_dir=out_dir) as run:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            run.step()


def _claim(out_dir, pid: int) -> None:
    """A claim another process on this machine made, as it is written without ``/proc``."""
    out_dir.mkdir(parents=True)
    record = {"host": socket.gethostname(), "boot_id": None, "pid_ns": None, "pid": pid, "pid_start": None,
              "started": "2026-11-27T00:00:00+00:00", "token": "0" * 32}
    (out_dir / LOCK).write_text(json.dumps(record))


def test_a_run_commits_without_proc_and_reports_its_peak_memory(no_proc, tmp_path):
    assert claim_record.machine()["boot_id"] is None
    _run(tmp_path / "run")
    steps = analysis.load_steps(tmp_path / "run")
    assert list(steps.step) == [0, 1] and (steps.peak_memory_bytes > 0).all()  # ru_maxrss
    assert len(analysis.load_stats(tmp_path / "run")) > 0


def test_without_proc_a_dead_owners_claim_is_taken_over_and_a_live_ones_refused(no_proc, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _claim(tmp_path / "dead", int(dead.stdout))
    _run(tmp_path / "dead")
    assert (tmp_path / "dead" / "manifest.json").is_file()

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _claim(tmp_path / "live", live.pid)
        with pytest.raises(OutputError, match=rf"process {live.pid} on host"):
            _run(tmp_path / "live")
    finally:
        live.kill()
        live.wait()
    assert not (tmp_path / "live" / "manifest.json").exists()
