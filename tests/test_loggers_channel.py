"""A live logger's channel (``runner.live.channel``): ``cpu_seconds`` counts what the tool does on its thread;
``wait_written`` waits for every step's lines to be sent, and says when they are not."""
from __future__ import annotations

import threading
import time

import torch
from torch import nn

import runner
from runner.live.channel import Channel


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
