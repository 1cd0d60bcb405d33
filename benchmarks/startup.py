"""Start-up and time-to-error in CPU time, against importing torch and torchvision.

    python -m benchmarks.startup --rounds 8     # on a quiet machine; prints one table

Four commands, interleaved round by round, each a child process whose CPU time (user + system,
its own rusage from ``os.wait4``) is taken, since CPU time is what other processes' load disturbs
least: importing torch and torchvision (what a hand-written script pays), the same import with the
cyclic garbage collector paused as the runner pauses it while it starts (``runner.cli.startup_gc``;
the floor the runner's own work is measured from), ``python -m runner hooks=none model=convnet`` (a
whole one-step run) and a config mistake (``hooks=clip hooks.clip.type=clmap``), whose one line must
come with status 2. The table gives each median, its difference from and ratio to the plain import;
the run's target, issue 43's "the runner's own start-up at most +0.5 s of CPU", is judged against the
paused import, so that the collector's saving in importing torch is not counted as the runner's; a
mistake must be answered in under 1 s of CPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT = ("import torch, torchvision", ["-c", "import torch, torchvision"], 0)
PAUSED = ("import torch, torchvision (collector paused)", ["-c", "import gc; gc.disable(); import torch, torchvision"], 0)
RUN = ("python -m runner hooks=none model=convnet", ["-m", "runner", "hooks=none", "model=convnet"], 0)
MISTAKE = ("python -m runner hooks=clip hooks.clip.type=clmap", ["-m", "runner", "hooks=clip", "hooks.clip.type=clmap"], 2)
COMMANDS = (IMPORT, PAUSED, RUN, MISTAKE)
HEADER = ["command", "CPU s", "- import", "/ import", "wall s", "target (CPU)"]
#: The most CPU seconds each may cost over the paused import (the run), or in all (the mistake).
RUN_OVER_IMPORT_S, MISTAKE_S = 0.5, 1.0


@dataclass
class Child:
    """One child process's wall and CPU seconds, exit status and last line on stderr."""

    wall_s: float
    cpu_s: float
    status: int
    last_line: str


def run_child(args: list[str], cwd: Path) -> Child:
    """``python ARGS`` from ``cwd``: its own rusage (``os.wait4``), so no other child's CPU is counted."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return Child(wall, usage.ru_utime + usage.ru_stime, proc.returncode, lines[-1] if lines else "")


def measure(rounds: int) -> dict[str, list[Child]]:
    """Each command ``rounds`` times, interleaved; a command ending with another status than its own raises."""
    children: dict[str, list[Child]] = {name: [] for name, _, _ in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for i in range(rounds):
            for name, args, status in COMMANDS:
                extra = [f"hydra.run.dir={tmp}/{i}"] if args[0] == "-m" else []
                child = run_child([*args, *extra], ROOT)
                if child.status != status:
                    raise RuntimeError(f"{name} exited {child.status}, not {status}: {child.last_line}")
                children[name].append(child)
    return children


def table(children: dict[str, list[Child]], judged: Callable[[str, bool], str] | None = None) -> list[list[str]]:
    """Rows: command, median CPU s, difference from the import, ratio to it, median wall s, target
    (``judged(target, met)`` writes the verdict: ``benchmarks.run`` judges nothing with ``--quick``)."""
    judged = judged or _verdict
    cpu = {name: statistics.median(c.cpu_s for c in runs) for name, runs in children.items()}
    wall = {name: statistics.median(c.wall_s for c in runs) for name, runs in children.items()}
    floor = cpu[IMPORT[0]]
    own = cpu[RUN[0]] - cpu[PAUSED[0]]
    targets = {IMPORT[0]: "", PAUSED[0]: "",
               RUN[0]: judged(f"≤ +{RUN_OVER_IMPORT_S} s over the paused import ({own:+.2f})", own <= RUN_OVER_IMPORT_S),
               MISTAKE[0]: judged(f"< {MISTAKE_S} s", cpu[MISTAKE[0]] < MISTAKE_S)}
    return [[name, f"{cpu[name]:.2f}", f"{cpu[name] - floor:+.2f}", f"{cpu[name] / floor:.2f}", f"{wall[name]:.2f}",
             targets[name]] for name in children]


def _verdict(target: str, met: bool) -> str:
    return f"{target}: {'met' if met else 'missed'}"


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each command (medians are reported)")
    args = parser.parse_args(argv)
    children = measure(args.rounds)
    rows = table(children)
    print(f"Start-up and time-to-error, median of {args.rounds} (CPU: the child's user + system)")
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"the mistake's line: {children[MISTAKE[0]][-1].last_line}")
    return rows


if __name__ == "__main__":
    main()
