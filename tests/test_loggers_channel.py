"""A live logger's channel (``runner.live.channel``): its thread, and what the tool starts from it, run at
nice ``LOGGER_NICE``; ``wait_written`` waits for every step's lines to be sent, and says when they are not."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch import nn

import runner
from runner.live.channel import LOGGER_NICE, Channel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value is a thread's on Linux only")


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


class Recording:
    """A tool that notes its thread's nice value and that of a process it starts, and each line; ``gate``
    (when given) holds every line until set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.lines, self.gate = [], gate
        self.opened_nice = nice_of(threading.get_native_id())
        child = subprocess.Popen(["sleep", "30"])
        self.child_nice = nice_of(child.pid)
        child.kill()
        child.wait()

    def log(self, line) -> None:
        self.log_nice = nice_of(threading.get_native_id())
        if self.gate is not None:
            self.gate.wait()
        time.sleep(0.05)  # a slow tool: the lines are still being sent when the run asks
        self.lines.append(line)

    def close(self, failed: bool) -> None:
        pass


def test_the_logger_thread_and_what_it_starts_run_at_the_lowest_priority_and_the_run_does_not():
    before = nice_of(threading.get_native_id())
    opened: list[Recording] = []
    channel = Channel("test", lambda: opened.append(Recording()) or opened[0], size=8, timeout_s=10)
    channel.put(0)
    assert channel.wait_sent(10)
    channel.close()
    tool = opened[0]
    assert tool.opened_nice == tool.log_nice == tool.child_nice == max(LOGGER_NICE, before)
    assert nice_of(threading.get_native_id()) == before  # the run's own thread keeps its priority
    assert channel.dropped == 0


class Burning:
    """A tool whose ``log`` burns CPU on its thread and notes how much (``time.thread_time``)."""

    def __init__(self) -> None:
        self.burned = 0.0

    def log(self, line) -> None:
        start = time.thread_time()
        sum(i * i for i in range(300_000))
        self.burned += time.thread_time() - start

    def close(self, failed: bool) -> None:
        pass


def test_cpu_seconds_counts_what_the_tool_does_on_the_logger_thread_and_keeps_it_once_the_thread_ends():
    tool = Burning()
    channel = Channel("test", lambda: tool, size=8, timeout_s=10)
    for step in range(3):
        channel.put(step)
    assert channel.wait_sent(60)
    running = channel.cpu_seconds()
    assert running >= tool.burned > 0
    channel.close()
    assert channel.cpu_seconds() >= running and channel.cpu_seconds() == channel.cpu_seconds()


def train(model, run, steps):
    for _ in range(steps):
        model.zero_grad()
        loss = model(torch.randn(4, 4)).sum()
        loss.backward()
        run.step(loss)


def test_wait_written_returns_once_every_step_is_sent_and_false_when_a_tool_hangs(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    slow, gate = Recording(), threading.Event()
    hanging = Recording(gate)
    with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "slow", logger={"wandb": {}},
                       sinks={"wandb": slow}) as run:
        train(model, run, 5)
        assert run.writer.wait_written(60)
        assert [line.step for line in slow.lines] == [0, 1, 2, 3, 4]  # all sent, though each took 50 ms
    with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "hanging",
                       logger={"wandb": {"close_timeout_s": 5}}, sinks={"wandb": hanging}) as run:
        train(model, run, 3)
        assert not run.writer.wait_written(0.5)
        assert run.writer.live.channels["wandb"].dropped == 0  # waiting, not dropped
        gate.set()
        assert run.writer.wait_written(60)
        assert [line.step for line in hanging.lines] == [0, 1, 2]
