"""A live logger's tool in a process of its own (``runner.live.process``): at a lower priority, every line
logged; its errors, its death and its hangs reach the run as they would from its own thread."""
from __future__ import annotations

import os
import re
import signal
import socket
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
from runner.live import process
from runner.live.channel import Channel
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
    sink.open()
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
    cannot = r"(FileExistsError|NotADirectoryError): .*a-file[^:]*"
    channel = Channel("tensorboard", lambda: ProcessSink("tensorboard", TensorBoardLogger(dir=str(occupied / "tb")),
                                                         RunContext(tmp_path)), size=4, timeout_s=60)
    channel.put(LogLine(0, {"train/loss": 1.0}))
    channel.close()
    assert children() == before
    # the tool's own error, not the end of the process the sink ended itself
    assert re.fullmatch(f"could not start: {cannot}: 1 of 1 lines not sent \\(none was sent\\)", channel.summary())


def test_a_tool_process_that_died_is_said_on_the_next_line(tmp_path):
    sink = ProcessSink("tensorboard", TensorBoardLogger(dir=str(tmp_path)), RunContext(tmp_path))
    sink.open()
    assert sink.diagnosis() is None
    os.kill(sink.process.pid, signal.SIGKILL)
    sink.process.wait()
    with pytest.raises(ToolProcessError, match=r"^its tool process ended \(killed by SIGKILL\)$"):
        sink.log(LogLine(0, {"train/loss": 1.0}))
    assert sink.diagnosis() == "its tool process ended (killed by SIGKILL)"
    with pytest.raises(ToolProcessError):
        sink.close(failed=False)


def logger_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]


def tool_process(before: set[int], timeout_s: float = 120) -> int:
    """The run's one tool process once it has started: the logger's own thread starts it, and on a busy
    machine that thread may not have run by the run's second step."""
    deadline = time.monotonic() + timeout_s
    while not (started := children() - before):
        assert time.monotonic() < deadline, f"no tool process after {timeout_s} s"
        time.sleep(0.05)
    (tool,) = started
    return tool


def run_steps(tmp_path, steps: int, logger: dict, at_step: dict | None = None):
    """``steps`` steps under ``runner.attach`` with ``logger``; ``at_step[i](run, tool_pid)`` is called
    before step ``i`` (``steps``: after the last). The LoggerWarnings said, and the seconds the run's end
    (closing its loggers) took."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = children()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "run", logger=logger) as run:
            for step in range(steps + 1):
                if step in (at_step or {}):
                    at_step[step](run, tool_process(before))
                if step < steps:
                    loss = model(torch.randn(3, 4)).sum()
                    loss.backward()
                    run.step(loss)
            ending = time.monotonic()
    assert children() == before  # the tool's process is ended with the run, whatever happened to it
    assert sorted(set(analysis.load_stats(tmp_path / "run").step)) == list(range(steps))  # the record is whole
    return logger_warnings(caught), time.monotonic() - ending


def once_sent(act):
    """``act(tool_pid)`` once every step so far was written and sent (the tool is open and keeps up)."""
    def at_step(run, tool):
        assert run.writer.wait_written(120)
        act(tool)
    return at_step


def test_a_tool_that_falls_behind_sends_the_runs_last_step_and_says_how_many_lines_it_skipped(tmp_path):
    steps = 40

    def stop(tool):  # the tool stops (a busy machine) from step 1 to the run's end
        os.kill(tool, signal.SIGSTOP)

    def resume(run, tool):  # once the writer thread offered every line (it may lag behind the steps)
        assert run.writer.wait_written(120, sent=False)
        os.kill(tool, signal.SIGCONT)

    said, _ = run_steps(tmp_path, steps, {"tensorboard": {"queue": 4}}, {1: once_sent(stop), steps: resume})
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = [e.step for e in events.Scalars("train/loss")]
    # step 0, the line being sent as it stopped (if its thread took one), then the newest 4 that waited
    assert logged[0] == 0 and logged[-4:] == list(range(steps - 4, steps)) and len(logged) in (5, 6)
    assert said == [f"logger tensorboard: fell behind the run: {steps - len(logged)} of {steps} lines not sent "
                    f"(the last sent was step {steps - 1}); the parquet files are the run's record"]


def test_a_killed_tool_process_is_said_as_ended_with_its_signal_not_as_falling_behind(tmp_path):
    said, _ = run_steps(tmp_path, 5, {"tensorboard": {}}, {1: once_sent(lambda tool: os.kill(tool, signal.SIGKILL))})
    ended = "logger tensorboard: its tool process ended (killed by SIGKILL)"
    assert said[-1] == f"{ended}: 4 of 5 lines not sent (the last sent was step 0); the parquet files are the run's record"
    assert said[:-1] in ([], [f"{ended}; the lines it cannot send are dropped and the run goes on "
                              f"(the parquet files are its record)"])  # said at once when a step saw it


def test_an_unreachable_mlflow_server_is_said_and_does_not_hold_the_runs_end(tmp_path):
    pytest.importorskip("mlflow")
    with socket.socket() as s:  # a port nothing listens on: a server that is down
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    # MLflow's client retries a refused connection for minutes: the run's end sees the server refuse and gives up
    said, closing_s = run_steps(tmp_path, 3, {"mlflow": {"tracking_uri": uri, "close_timeout_s": 600}})
    assert said == [f"logger mlflow: its server {uri} is unreachable (Connection refused): 3 of 3 lines not sent "
                    f"(none was sent); the parquet files are the run's record"]
    assert closing_s < 600 / 40  # not close_timeout_s: UNREACHABLE_S after the first refusal, on a busy machine


def test_a_tool_that_hangs_while_opening_is_ended_at_the_runs_end(tmp_path, monkeypatch):
    # the tool's process never answers its opening (a hung wandb.init or MLflow connect): it reads on until
    # its requests' pipe closes, which is when the run's process ends (a failing test leaves nothing running)
    monkeypatch.setattr(process, "TOOL_SIDE", "import sys; sys.stdin.buffer.read()")
    said, _ = run_steps(tmp_path, 2, {"tensorboard": {"close_timeout_s": 1}})
    assert said == ["logger tensorboard: sent nothing for close_timeout_s=1 at the run's end: 2 of 2 lines not "
                    "sent (none was sent); the parquet files are the run's record"]


def test_a_hung_tool_process_costs_one_warning_and_is_ended_with_the_run(tmp_path):
    said, _ = run_steps(tmp_path, 4, {"tensorboard": {"close_timeout_s": 1}},
                        {2: once_sent(lambda tool: os.kill(tool, signal.SIGSTOP))})  # the tool hangs (a dead server)
    assert said == ["logger tensorboard: sent nothing for close_timeout_s=1 at the run's end: 2 of 4 lines not sent "
                    "(the last sent was step 1); the parquet files are the run's record"]


RUN_THAT_DIES = """
import sys, time
from pathlib import Path
from runner.live import LiveLoggers, RunContext
from runner.live.lines import LogLine
from runner.live.to_tensorboard import TensorBoardLogger
with LiveLoggers({"tensorboard": TensorBoardLogger(dir=sys.argv[1])}, RunContext(Path(sys.argv[1])), {}) as live:
    live.start()  # as a run starts its loggers: each tool's process is started and opened on its channel's thread
    live.channels["tensorboard"].put(LogLine(0, {"train/loss": 1.0}))
    assert live.wait_sent(120)
    (tool,) = [pid for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]
    print(tool, flush=True)
    time.sleep(600)
"""


def state(stat: Path) -> str:
    """A process's state letter (``R``, ``S``, ``T`` stopped, ``Z`` ended and not yet reaped); ``Z`` once gone."""
    found_fields = fields(stat)
    return found_fields[0] if found_fields else "Z"


def test_a_hung_tool_process_is_killed_with_the_runs_process(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", RUN_THAT_DIES, str(tmp_path / "run")], stdout=subprocess.PIPE,
                           text=True)
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
