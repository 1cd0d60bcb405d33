"""A live logger's tool in a process of its own (``runner.live.process``): at a lower priority, every line
logged; its errors, its death and its hangs reach the run as they would from its own thread."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import runner
import runner.analysis as analysis
from runner.live import LoggerWarning, RunContext
from runner.live.lines import LogLine
from runner.live.process import TOOL_NICE, ProcessSink, ToolProcessError
from runner.live.to_tensorboard import TensorBoardLogger


def fields(stat: Path) -> list[str] | None:
    """The fields of a ``/proc/PID/stat`` after the command's name (state, parent, ...); None once it is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children() -> set[int]:
    """The process ids of this process's living children."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        found_fields = fields(stat)
        if found_fields and int(found_fields[1]) == os.getpid() and found_fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def test_the_tool_runs_in_its_own_process_at_lower_priority_and_every_value_reaches_its_file(tmp_path):
    sink = ProcessSink("tensorboard", TensorBoardLogger(dir=str(tmp_path)), RunContext(tmp_path))
    pid = sink.process.pid
    assert pid != os.getpid() and os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + TOOL_NICE
    values = np.linspace(-1, 1, 50, dtype=np.float32)
    sink.log(LogLine(3, {"train/loss": 1.5, "train/stats/fc/output/std": 0.25}, {"train/extract/fc/output": values}))
    sink.close(failed=False)
    assert sink.process.returncode == 0
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    assert events_file.name.split(".")[-2] == str(pid)  # written by the tool's process
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    assert {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]} == \
        {"train/loss": [(3, 1.5)], "train/stats/fc/output/std": [(3, 0.25)]}
    (histogram,) = events.Histograms("train/extract/fc/output")
    assert (histogram.step, histogram.histogram_value.num, histogram.histogram_value.min) == (3, 50, -1.0)
    assert histogram.histogram_value.sum == pytest.approx(float(values.sum(dtype=np.float64)), abs=1e-5)


def test_a_tool_that_cannot_start_is_one_error_line_and_leaves_no_process(tmp_path):
    occupied = tmp_path / "a-file"
    occupied.write_text("")
    before = children()
    with pytest.raises(ToolProcessError, match=r"^(FileExistsError|NotADirectoryError): "):
        ProcessSink("tensorboard", TensorBoardLogger(dir=str(occupied / "tb")), RunContext(tmp_path))
    assert children() == before


def test_a_tool_process_that_died_is_said_on_the_next_line(tmp_path):
    sink = ProcessSink("tensorboard", TensorBoardLogger(dir=str(tmp_path)), RunContext(tmp_path))
    os.kill(sink.process.pid, signal.SIGKILL)
    sink.process.wait()
    with pytest.raises(ToolProcessError, match=r"its process ended \(exit status -9\)"):
        sink.log(LogLine(0, {"train/loss": 1.0}))
    with pytest.raises(ToolProcessError):
        sink.close(failed=False)


def test_a_hung_tool_process_costs_one_warning_and_is_ended_with_the_run(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = children()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "run",
                           logger={"tensorboard": {"close_timeout_s": 1}}) as run:
            for step in range(4):
                if step == 2:
                    assert run.writer.wait_written(120)
                    (tool,) = children() - before
                    os.kill(tool, signal.SIGSTOP)  # the tool hangs (a dead server)
                loss = model(torch.randn(3, 4)).sum()
                loss.backward()
                run.step(loss)
    said = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]
    assert said == ["logger tensorboard: sent nothing for close_timeout_s=1 at the run's end; the lines it cannot "
                    "send are dropped and the run goes on (the parquet files are its record)"]
    assert children() == before  # ended, not left stopped
    assert sorted(set(analysis.load_stats(tmp_path / "run").step)) == [0, 1, 2, 3]


RUN_THAT_DIES = """
import sys, time
from pathlib import Path
from runner.live import RunContext
from runner.live.process import ProcessSink
from runner.live.to_tensorboard import TensorBoardLogger
sink = ProcessSink("tensorboard", TensorBoardLogger(dir=sys.argv[1]), RunContext(Path(sys.argv[1])))
print(sink.process.pid, flush=True)
time.sleep(600)
"""


def state(stat: Path) -> str:
    """A process's state letter (``R``, ``S``, ``T`` stopped, ``Z`` ended and not yet reaped); ``Z`` once gone."""
    found_fields = fields(stat)
    return found_fields[0] if found_fields else "Z"


def test_a_hung_tool_process_is_killed_with_the_runs_process(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", RUN_THAT_DIES, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pid = int(run.stdout.readline())
    tool = Path(f"/proc/{pid}/stat")
    try:
        os.kill(pid, signal.SIGSTOP)  # hung: it would not even see its pipe close
        run.kill()  # SIGKILL: the run's process cleans nothing up
        run.wait()
        deadline = time.monotonic() + 30
        while state(tool) != "Z" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state(tool) == "Z"
    finally:
        if state(tool) != "Z":
            os.kill(pid, signal.SIGKILL)
