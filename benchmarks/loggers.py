"""``python -m benchmarks.loggers``: the ``stats`` preset with each live logger on, against ``stats`` alone.

One process, one phase per contender, each of interleaved rounds (``benchmarks.run.interleaved``) of
``bare`` (no hooks), ``stats`` (``runner.attach(hooks=["stats"])``, parquet written by the background
writer) and the contender: ``stats`` with ``logger=tensorboard``, ``wandb`` (offline) or ``mlflow`` (a
local SQLite store), each ``every=1``, or W&B's own ``wandb.watch(log="gradients", log_freq=1)``. A
phase's tools are closed before the next phase opens its own: a run has its own logger's processes
on the machine, not every other logger's (W&B's service writing on after ``log`` returns).

In each round every variant runs ``--steps`` consecutive steps and, inside its timing, waits until
its run has written them and its logger has sent their lines (``StepWriter.wait_written``): each
variant pays for its own writing and logging, none of it spills into the next variant's time, and
the logging of all but a segment's last step overlaps the next step's compute, as in a run.

Per variant and step: wall seconds; CPU seconds of this process (all threads) plus its descendant
processes (each logger's tool process and W&B's service: ``process_time`` does not count them), and
by part: the logger's thread (``Channel.cpu_seconds``: pickling each line to its tool's process),
the threads made with the variant (the parquet writer's, the logger's, ``wandb.watch``'s connection
to its service) and the descendant processes (at a tick's resolution, 10 ms); how often the compute
threads (this one and torch's pool) lost their core to another thread (what a tool's wake-ups
cost torch beyond their CPU seconds); the lines each logger dropped (a ratio bought by dropping
lines is no result). Ratios are medians of the per-round ratio to the phase's ``stats`` (target
<= 1.02 for resnet18 at batch 8) and ``bare``. Numbers from a machine other processes load are
noise: read the ratios of a quiet one; the CPU seconds by part are steadier.

    python -m benchmarks.loggers            # resnet18, batch 8, 224x224, 20 rounds of 4 steps
    python -m benchmarks.loggers --quick    # a small convnet, 2 rounds: the smoke test (wandb.watch too)
    python -m benchmarks.loggers --loggers mlflow --no-watch   # one phase: MLflow against stats alone
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
import time
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
    """The ``/proc/PID/stat`` files of this process's descendants (each logger's tool process and what it
    starts: W&B's service), none without ``/proc``."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents[stat] = stat.read_text().rsplit(")", 1)[1].split()[1]
    found, frontier = [], {str(os.getpid())}
    while frontier:
        below = [stat for stat, parent in parents.items() if parent in frontier]
        found += below
        frontier = {stat.parent.name for stat in below}
    return found


def _name(stat: Path) -> str:
    return stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]


def services() -> set[str]:
    """The pids of every W&B service on the machine (``wandb-core``), whoever started it."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if _name(stat) == "wandb-core":
                found.add(stat.parent.name)
    return found


def left_running(before: set[str], wait_s: float = 10.0) -> list[str]:
    """The W&B services that a phase started and that are still running ``wait_s`` after its tools closed."""
    deadline = time.monotonic() + wait_s
    while (left := services() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(left)


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


#: Each logger the benchmark times: its ``logger=`` value (``{tmp}``: the phase's temporary directory).
LOGGERS = {"tensorboard": {"tensorboard": {}}, "wandb": {"wandb": {}},
           "mlflow": {"mlflow": {"tracking_uri": "sqlite:///{tmp}/mlflow.db"}}}
#: The phase of W&B's own ``wandb.watch``.
WATCH = "wandb.watch"


def phase(model, x, tmp: Path, stack: contextlib.ExitStack, steps: int, contender: str) -> list[Segment]:
    """One phase's segments: ``bare``, ``stats`` and ``contender`` (a logger's name: ``stats`` with it on,
    or ``WATCH``), each on its own copy of ``model``; what they open stays open until ``stack`` closes."""
    fresh = lambda: copy.deepcopy(model)  # noqa: E731
    plain = bare(fresh(), x)
    plain.step()  # torch's own threads (its compute pool) are made by the first step: none of a variant's
    compute = threads()  # this thread and torch's pool (and what ran before: no logger's)
    found = [Segment(plain, steps), with_threads(lambda: attached("stats", fresh(), x, tmp / "stats", stack, {}, steps))]
    if contender == WATCH:
        watched = with_threads(lambda: Segment(wandb_watch(fresh(), x, "gradients"), steps))
        stack.callback(watched.variant.close)
        found.append(watched)
    else:
        logger = {name: {key: str(value).format(tmp=tmp) for key, value in cfg.items()}
                  for name, cfg in LOGGERS[contender].items()}
        found.append(with_threads(lambda: attached(f"stats + {contender}", fresh(), x, tmp / contender, stack,
                                                   logger, steps)))
    procs = children()
    for segment in found:
        segment.procs, segment.compute = procs, compute
    return found


def measure(segments: list[Segment], rounds: int, warmup: int, steps: int) -> dict[str, dict]:
    """Each segment's ratios to ``stats`` and ``bare`` of the same rounds, CPU by part, preemptions, lines dropped."""
    wall, cpu = interleaved([s.timed for s in segments], rounds, warmup)
    # a tool's process is a child process: its CPU is the logging's too (process_time counts this process only)
    total = {s.variant.name: [c + child for c, child in zip(cpu[s.variant.name], s.parts["children"][warmup:])]
             for s in segments}
    return {s.variant.name: {
        "median_s": statistics.median(wall[s.variant.name]) / steps,
        "over_stats": paired_ratio(wall[s.variant.name], wall["stats"]),
        "over_bare": paired_ratio(wall[s.variant.name], wall["bare"]),
        "cpu_over_stats": paired_ratio(total[s.variant.name], total["stats"]),
        "cpu_s_per_step": {"process_and_children": statistics.median(total[s.variant.name]) / steps,
                           **{part: statistics.median(seconds[warmup:]) / steps for part, seconds in s.parts.items()}},
        "compute_preempted_per_step": statistics.median(s.preempted[warmup:]) / steps,
        "dropped_lines": s.dropped(),
    } for s in segments}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loggers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small convnet and 2 rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4, help="consecutive steps of a variant in a round")
    parser.add_argument("--loggers", default=",".join(LOGGERS),
                        help=f"the loggers to time, comma-separated (default: all of {', '.join(LOGGERS)})")
    parser.add_argument("--no-watch", action="store_true", help="leave out wandb.watch")
    parser.add_argument("--out", type=Path, default=None, help="write loggers.json here")
    args = parser.parse_args(argv)
    loggers = [name for name in args.loggers.split(",") if name]
    unknown = sorted(set(loggers) - set(LOGGERS))
    if unknown:
        parser.error(f"--loggers: unknown {', '.join(unknown)}; choose from {', '.join(LOGGERS)}")
    torch.manual_seed(0)
    model, x = (ConvNet(), torch.randn(2, 3, 8, 8)) if args.quick else \
        (torchvision.models.resnet18(), torch.randn(8, 3, 224, 224))
    rounds, warmup, steps = (2, 1, 2) if args.quick else (args.rounds, 3, args.steps)
    contenders = loggers + ([WATCH] if wandb_installed() and not args.no_watch else [])
    result = {"model": "convnet" if args.quick else "resnet18", "batch": x.shape[0], "rounds": rounds,
              "steps_per_round": steps, "target": TARGET, "phases": {}}
    for contender in contenders:
        before = services()
        with tempfile.TemporaryDirectory(prefix="bench-loggers-") as tmp, contextlib.ExitStack() as stack:
            segments = phase(model, x, Path(tmp), stack, steps, contender)
            result["phases"][contender] = {
                "variants": measure(segments, rounds, warmup, steps),
                "children": [_name(stat) for stat in segments[0].procs]}
        # a service wandb.watch starts lives as long as this process does; a tool's ends with its phase
        result["phases"][contender]["services_left"] = [] if contender == WATCH else left_running(before)
    return print_and_write(result, args.out, "loggers.json")


if __name__ == "__main__":
    main()
