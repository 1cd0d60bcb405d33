"""``python -m benchmarks.loggers``: the ``stats`` preset with each live logger on, against ``stats`` alone.

One process, interleaved rounds (``benchmarks.run.interleaved``): ``bare`` (no hooks), ``stats``
(``runner.attach(hooks=["stats"])``, parquet written by the background writer), ``stats`` with
``logger=tensorboard``, ``wandb`` (offline) and ``mlflow`` (a local SQLite store), each
``every=1``, and W&B's own ``wandb.watch(log="gradients", log_freq=1)`` beside them.

In each round every variant runs ``--steps`` consecutive steps and, inside its timing, waits until
its run has written them and its logger has sent their lines (``StepWriter.wait_written``): each
variant pays for its own writing and logging, none of it spills into the next variant's time, and
the logging of all but a segment's last step overlaps the next step's compute, as in a run.

Per variant and step: wall seconds; CPU seconds of this process (all threads) plus its child
processes (W&B's service, which writes the offline run: ``process_time`` does not count it), and
by part: the logger's thread (``Channel.cpu_seconds``), the threads made with the variant (the
parquet writer's, the logger's, the tool's own: TensorBoard's event-file thread, W&B's connection
to its service) and the child processes (at a tick's resolution, 10 ms); how often the compute
threads (this one and torch's pool) lost their core to another thread (what a logger's wake-ups
cost torch beyond their CPU seconds); the lines each logger dropped (a ratio bought by dropping
lines is no result). Ratios are medians of the per-round ratio to ``stats`` (target <= 1.02 for
resnet18 at batch 8) and to ``bare``. Numbers
from a machine other processes load are noise: read the ratios of a quiet one; the CPU seconds
by part are steadier.

W&B's service is one per process, shared by the ``stats + wandb`` run and the watched run: the
watched run is made first (``wandb.watch`` logs into the global run, which a later ``wandb.init``
would return instead of a new one), and the threads its ``wandb.init`` makes (W&B's connection to
its service) are counted as the ``stats + wandb`` run's own.

    python -m benchmarks.loggers            # resnet18, batch 8, 224x224, 20 rounds of 4 steps
    python -m benchmarks.loggers --quick    # a small convnet, 2 rounds: the smoke test (wandb.watch too)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torchvision

import runner
from benchmarks.compiled import print_and_write
from benchmarks.run import interleaved, paired_ratio
from benchmarks.variants import Variant, bare, wandb_installed, wandb_watch
from runner.sources.models import ConvNet

#: The issue's target: a step with a logger on over the same step with ``stats`` alone.
TARGET = 1.02
#: How long a segment's end waits for its writing and logging (a logger that hangs).
WAIT_S = 600.0


def children() -> list[Path]:
    """The ``/proc/PID/stat`` files of this process's child processes (W&B's service; none without ``/proc``)."""
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if stat.read_text().rsplit(")", 1)[1].split()[1] == me:
                found.append(stat)
    return found


def threads() -> set[Path]:
    """The ``/proc/PID/task/TID/stat`` files of this process's threads (none without ``/proc``)."""
    return set(Path(f"/proc/{os.getpid()}/task").glob("*/stat"))


def preemptions(stats) -> int:
    """How often the threads whose ``stat`` files are ``stats`` lost their core without waiting for
    anything (``nonvoluntary_ctxt_switches`` of each thread's ``status``): another thread took it."""
    total = 0
    for stat in stats:
        with contextlib.suppress(OSError):
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def cpu_seconds(stats) -> float:
    """User + system CPU seconds of the processes or threads whose ``stat`` files are ``stats``."""
    total = 0
    for stat in stats:
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Segment:
    """``steps`` steps of ``variant``, then ``settle`` (inside the timing): ``timed`` is what a round runs.
    Each run's CPU seconds by part are kept: its logger's thread (``logger``: a channel, or None), the
    threads made with the variant (``own``: the writer's, the logger's, the tool's own) and the child
    processes ``procs``; and how often the compute threads (``compute``) were preempted;
    ``dropped()``: the lines its logger dropped so far."""

    def __init__(self, variant: Variant, steps: int, settle=lambda: None, logger=None, dropped=lambda: 0) -> None:
        self.variant, self.steps, self.settle, self.logger, self.dropped = variant, steps, settle, logger, dropped
        self.timed = Variant(variant.name, variant.what, variant.model, self.run)
        self.own: set[Path] = set()
        self.procs: list[Path] = []
        self.compute: set[Path] = set()
        self.parts: dict[str, list[float]] = {"logger_thread": [], "own_threads": [], "children": []}
        self.preempted: list[int] = []

    def run(self) -> None:
        before, preempted = self._cpu(), preemptions(self.compute)
        for _ in range(self.steps):
            self.variant.step()
        self.settle()
        for part, (end, start) in zip(self.parts.values(), zip(self._cpu(), before)):
            part.append(end - start)
        self.preempted.append(preemptions(self.compute) - preempted)

    def _cpu(self) -> tuple[float, float, float]:
        return self.logger.cpu_seconds() if self.logger else 0.0, cpu_seconds(self.own), cpu_seconds(self.procs)


def attached(name: str, model, x, out_dir: Path, stack: contextlib.ExitStack, logger: dict, steps: int) -> Segment:
    """``steps`` ``runner.attach(hooks=["stats"], logger=logger)`` steps of ``model``, written and sent
    (open until ``stack`` closes). One step is run (and its line sent) here: the logger's tool is open."""
    run = stack.enter_context(runner.attach(model, hooks=["stats"], out_dir=out_dir, logger=logger))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = model(x).sum()
        loss.backward()
        run.step(loss)

    def settle() -> None:
        if not run.writer.wait_written(WAIT_S):
            raise RuntimeError(f"{name}: its steps were not written and sent within {WAIT_S:g} s")

    step()
    settle()
    channels = list(run.writer.live.channels.values()) if run.writer.live else []
    return Segment(Variant(name, f"`stats`, logger={list(logger) or 'none'}", model, step), steps, settle,
                   channels[0] if channels else None, lambda: sum(channel.dropped for channel in channels))


def with_threads(make, also: frozenset[Path] = frozenset()) -> Segment:
    """The segment ``make()`` returns, owning the threads made meanwhile (and ``also``)."""
    before = threads()
    segment = make()
    segment.own = threads() - before | also
    return segment


def segments(model, x, tmp: Path, stack: contextlib.ExitStack, steps: int) -> list[Segment]:
    fresh = lambda: copy.deepcopy(model)  # noqa: E731
    plain = bare(fresh(), x)
    plain.step()  # torch's own threads (its compute pool) are made by the first step: none of a variant's
    compute = threads()  # this thread and torch's pool (and what ran before: no logger's)
    peers, wandb_threads = [], frozenset()
    if wandb_installed():
        before = threads()
        watch = wandb_watch(fresh(), x, "gradients")
        wandb_threads = frozenset(threads() - before)  # W&B's connection to its service: the logger's as well
        stack.callback(watch.close)
        peers.append(Segment(watch, steps))
    found = [Segment(plain, steps),
             with_threads(lambda: attached("stats", fresh(), x, tmp / "stats", stack, {}, steps)),
             with_threads(lambda: attached("stats + tensorboard", fresh(), x, tmp / "tb", stack,
                                           {"tensorboard": {}}, steps)),
             with_threads(lambda: attached("stats + wandb", fresh(), x, tmp / "wandb", stack, {"wandb": {}}, steps),
                          wandb_threads),
             with_threads(lambda: attached("stats + mlflow", fresh(), x, tmp / "mlflow", stack,
                                           {"mlflow": {"tracking_uri": f"sqlite:///{tmp / 'mlflow.db'}"}}, steps)),
             *peers]
    procs = children()
    for segment in found:
        segment.procs, segment.compute = procs, compute
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loggers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small convnet and 2 rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4, help="consecutive steps of a variant in a round")
    parser.add_argument("--out", type=Path, default=None, help="write loggers.json here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, x = (ConvNet(), torch.randn(2, 3, 8, 8)) if args.quick else \
        (torchvision.models.resnet18(), torch.randn(8, 3, 224, 224))
    rounds, warmup, steps = (2, 1, 2) if args.quick else (args.rounds, 3, args.steps)
    with tempfile.TemporaryDirectory(prefix="bench-loggers-") as tmp, contextlib.ExitStack() as stack:
        timed = segments(model, x, Path(tmp), stack, steps)
        wall, cpu = interleaved([s.timed for s in timed], rounds, warmup)
        result = {"model": "convnet" if args.quick else "resnet18", "batch": x.shape[0], "rounds": rounds,
                  "steps_per_round": steps, "target": TARGET, "variants": {},
                  "children": [stat.read_text().split("(", 1)[1].split(")")[0] for stat in timed[0].procs]}
        # W&B's service is a child process: its CPU is the logging's too (process_time counts this process only)
        total = {s.variant.name: [c + child for c, child in zip(cpu[s.variant.name], s.parts["children"][warmup:])]
                 for s in timed}
        for s in timed:
            name = s.variant.name
            result["variants"][name] = {
                "median_s": statistics.median(wall[name]) / steps,
                "over_stats": paired_ratio(wall[name], wall["stats"]),
                "over_bare": paired_ratio(wall[name], wall["bare"]),
                "cpu_over_stats": paired_ratio(total[name], total["stats"]),
                "cpu_s_per_step": {"process_and_children": statistics.median(total[name]) / steps,
                                   **{part: statistics.median(seconds[warmup:]) / steps
                                      for part, seconds in s.parts.items()}},
                "compute_preempted_per_step": statistics.median(s.preempted[warmup:]) / steps,
                "dropped_lines": s.dropped(),
            }
    return print_and_write(result, args.out, "loggers.json")


if __name__ == "__main__":
    main()
