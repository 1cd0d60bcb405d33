"""A live logger's channel (``runner.live.channel``): ``cpu_seconds`` counts what the tool does on its thread;
a logger that falls behind keeps the newest lines and says how many it skipped; ``wait_written`` waits
for every step's lines to be sent, and says when they are not."""
from __future__ import annotations

import threading
import time

import torch
from torch import nn

import runner
from runner.live.channel import Channel
from runner.live.lines import LogLine


class Recording:
    """A slow tool that keeps each line; ``gate`` (when given) holds every line until set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.lines, self.gate = [], gate

    def log(self, line) -> None:
        if self.gate is not None:
            self.gate.wait()
        time.sleep(0.05)  # a slow tool: the lines are still being sent when the run asks
        self.lines.append(line)

    def close(self, failed: bool) -> None:
        pass


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


def burn_here(seconds: float) -> None:
    """Burn ``seconds`` of CPU on the calling thread."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        sum(i * i for i in range(10_000))


def test_cpu_seconds_counts_what_the_tool_does_on_the_logger_thread_and_keeps_it_once_the_thread_ends():
    burn_here(1.0)  # the run's own thread: not the channel's
    tool = Burning()
    channel = Channel("test", lambda: tool, size=8, timeout_s=10)
    for step in range(3):
        channel.put(LogLine(step))
    assert channel.wait_sent(60)
    running = channel.cpu_seconds()
    assert tool.burned <= running < tool.burned + 0.5  # the channel thread's CPU, not the process's
    burned_running = tool.burned
    for step in range(3, 6):
        channel.put(LogLine(step))
    channel.close()
    assert tool.burned > burned_running  # the last three lines burned more after ``running`` was read
    assert tool.burned <= channel.cpu_seconds() < tool.burned + 0.5  # their CPU too, read after the thread ended


class Gated:
    """A slow tool: it holds its first line until ``gate`` is set (``holding`` says it holds it), then keeps each."""

    def __init__(self) -> None:
        self.steps, self.gate, self.holding = [], threading.Event(), threading.Event()

    def log(self, line) -> None:
        self.holding.set()
        self.gate.wait()
        self.steps.append(line.step)

    def close(self, failed: bool) -> None:
        pass


def test_a_logger_that_falls_behind_skips_the_oldest_waiting_lines_and_sends_the_runs_last_step():
    tool = Gated()
    channel = Channel("test", lambda: tool, size=10, timeout_s=60)
    channel.put(LogLine(0))
    assert tool.holding.wait(60)  # the tool holds step 0: every later line waits in the queue
    for step in range(1, 1500):
        channel.put(LogLine(step))
    tool.gate.set()
    channel.close()
    assert tool.steps == [0, *range(1490, 1500)]  # the newest ten waited; the run's last step was sent last
    assert (channel.offered, channel.sent, channel.skipped, channel.lost) == (1500, 11, 1489, 0)
    assert channel.summary() == "fell behind the run: 1489 of 1500 lines not sent (the last sent was step 1499)"
    assert channel.take_problem() is None  # said once


def test_a_logger_that_keeps_up_sends_every_line_and_says_nothing():
    tool = Gated()
    tool.gate.set()
    channel = Channel("test", lambda: tool, size=2, timeout_s=60)
    for step in range(20):
        channel.put(LogLine(step))
        assert channel.wait_sent(60)
    channel.close()
    assert tool.steps == list(range(20)) and channel.summary() is None


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
