"""``python -m benchmarks.sweep_start``: how soon a sweep starts, and what each of its jobs costs beyond its run.

Two measurements, each of the real command line in a child process:

- **Time to the first step**: from launching the README's 64-job activation-patching sweep
  (``gpt2_tiny``, 4 blocks x 16 positions, patched from a stored clean run) to the end of its
  first job's first step. Before any job runs, the command checks every job (composes, compiles
  and rehearses it: ``runner.cli.commandline``); that is what this measures. The child records
  the moment and exits, so the other 63 jobs are not run.
- **Per-job overhead of a big sweep**: a 1,000-job sweep of a tiny model (``model=linear
  hooks=stats``, one value of ``seed`` per job) against a loop of the same runs in one process
  (``compile_plan`` and ``loop.run`` of each job's overrides: what a script driving the runner
  would do). ``(sweep - loop) / jobs`` is what the command line, Hydra's launcher and the check
  add per job.

Wall time on a machine others load is noise: the CPU time of the child is printed beside it, and
the README reports numbers measured on an idle machine only.

    python -m benchmarks.sweep_start              # 64 patching jobs; a 1,000-job sweep (a few minutes)
    python -m benchmarks.sweep_start --quick      # 2 patching jobs, a 3-job sweep: the smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.process import ROOT

#: The README's patching sweep ("Activation patching"), with ``{layers}``, ``{positions}`` and the directories filled in.
PATCHING = ["model=gpt2_tiny", "model.n_layer={blocks}", "data=tokens", "data.seed=1", "loss=none", "mode=eval",
            "metric.diff=[3,4]", "hooks=patch", "hooks.patch.source={clean}", "hooks.patch.layers={layers}",
            "hooks.patch.index=range(0,{positions})"]
CLEAN = ["model=gpt2_tiny", "model.n_layer={blocks}", "data=tokens", "loss=none", "mode=eval", "metric.diff=[3,4]",
         "hooks=extract", r"hooks.extract.layers=re:transformer\.h\.\d+"]
#: The tiny model of the many-jobs sweep.
TINY = ["model=linear", "hooks=stats", "quiet=true"]
#: Issue 50's target: the patching sweep's first step within this many CPU seconds beyond a sweep of one job
#: of the same command (what checking its other jobs first costs; the imports both pay are not the sweep's).
TARGET_EXTRA_S = 3.0


@dataclass
class Timing:
    name: str
    jobs: int
    wall_s: float
    cpu_s: float


def _child(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of ``python ARGS`` from the project root; raises if it fails."""
    before, start = os.times(), time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall, after = time.perf_counter() - start, os.times()
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def first_step(tmp: Path, blocks: int, positions: int) -> Timing:
    """Seconds from launching the patching sweep to the end of its first job's first step."""
    fill = {"blocks": blocks, "clean": tmp / "clean", "positions": positions,
            "layers": ",".join(f"transformer.h.{i}" for i in range(blocks))}
    _child(["-m", "runner", *(o.format(**fill) for o in CLEAN), f"hydra.run.dir={tmp / 'clean'}", "quiet=true"])
    mark = tmp / "first_step.json"
    argv = ["-m", *(o.format(**fill) for o in PATCHING), f"hydra.sweep.dir={tmp / 'patching'}", "quiet=true"]
    start = time.time()
    wall, cpu = _child(["-m", "benchmarks.first_step_child", str(mark), *argv])
    at = json.loads(mark.read_text())
    return Timing("python -m runner -m ... (README patching sweep): to job 0's first step", blocks * positions,
                  at["time"] - start, at["cpu"])


def per_job(tmp: Path, jobs: int) -> list[Timing]:
    """The ``jobs``-job sweep of the tiny model through the command line, and the same runs in one loop."""
    seeds = f"seed=range(0,{jobs})"
    sweep = Timing("python -m runner -m (basic launcher)", jobs,
                   *_child(["-m", "runner", "-m", *TINY, seeds, f"hydra.sweep.dir={tmp / 'sweep'}"]))
    loop = Timing("the same runs in one process (compile_plan + loop.run)", jobs,
                  *_child(["-m", "benchmarks.sweep_start", "--loop", str(jobs), str(tmp / "loop")]))
    return [sweep, loop]


def run_loop(jobs: int, out: Path) -> None:
    """Each job of the tiny sweep composed, compiled and run in this process, one after the other."""
    from runner.config.compose import compose_config
    from runner.engine import loop
    from runner.engine.plan import compile_plan

    for seed in range(jobs):
        overrides = [*TINY, f"seed={seed}"]
        loop.run(compile_plan(compose_config(overrides), overrides), out / str(seed))


def main(argv: list[str] | None = None) -> list[Timing]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the smoke test")
    parser.add_argument("--loop", nargs=2, metavar=("JOBS", "OUT"), help=argparse.SUPPRESS)  # the loop's child
    args = parser.parse_args(argv)
    if args.loop:
        run_loop(int(args.loop[0]), Path(args.loop[1]))
        return []
    blocks, positions, jobs = (1, 2, 3) if args.quick else (4, 16, 1000)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-start-") as tmp:
        first = first_step(Path(tmp) / "many", blocks, positions)
        alone = first_step(Path(tmp) / "one", 1, 1)
        timings = [first, alone, *per_job(Path(tmp), jobs)]
    for t in timings:
        print(f"{t.name}: {t.jobs} jobs, {t.wall_s:.2f} s wall, {t.cpu_s:.2f} s CPU")
    extra = first.cpu_s - alone.cpu_s
    verdict = "not judged (--quick)" if args.quick else "met" if extra <= TARGET_EXTRA_S else "missed"
    print(f"the first step of {first.jobs} jobs beyond one job's: {extra:.2f} s CPU (target ≤ {TARGET_EXTRA_S:.0f} s: "
          f"{verdict})")
    sweep, loop = timings[2:]
    print(f"per-job overhead of the command line: {(sweep.wall_s - loop.wall_s) / jobs * 1000:.0f} ms wall, "
          f"{(sweep.cpu_s - loop.cpu_s) / jobs * 1000:.0f} ms CPU ({jobs} jobs)")
    print(json.dumps([asdict(t) for t in timings]))
    return timings


if __name__ == "__main__":
    main()
