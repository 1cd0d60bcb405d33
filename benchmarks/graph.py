"""``python -m benchmarks.graph``: what an attribution graph costs per prompt, against one forward and backward.

The graphs are the tutorial's (``docs/tutorials/attribution-graphs.md``): ``gpt2_tiny`` (2 blocks, width 32, a
61-token vocabulary) with the random transcoders of ``tests/fixtures/transcoders_gpt2_tiny`` spliced at both
MLPs, ``hooks=[transcoder,graph]`` over ``data=tokens`` prompts of 16 tokens. Two measurements:

- **Per prompt, in one process**: a graph run of the prompts through the runner's own plan and loop
  (``compile_plan`` and ``loop.run``: a job without Python's start-up), against one forward and backward of the
  same model on one prompt (its loss the sum of the logits), timed in the same rounds, alternated; the ratio is
  the run's seconds per prompt over the forward and backward's, the median of the rounds' (paired). The run
  pays a forward of the prompt, one per batch of targets (``hooks.graph.batch_size`` copies of the prompt) and a
  backward per batch, besides pruning and its tables.
- **A sweep of the prompts, as the command line runs it**: ``python -m runner -m`` sharded over two jobs
  (``data.num_shards=2 data.shard=0,1``), its wall and CPU seconds from the launch to the end, and whether its
  merged tables (``runner.analysis.graph.load_graphs`` of the sweep) equal the two jobs' own.

    python -m benchmarks.graph             # 64 prompts, 3 rounds (a few minutes on 2 cores)
    python -m benchmarks.graph --quick     # 2 prompts, one round: the smoke test

Tables go to ``benchmarks/results/graph.md`` and ``graph.parquet`` (``--out`` elsewhere).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from benchmarks.process import ROOT
from benchmarks.run import RESULTS, Report, paired_ratio
from runner.analysis.graph import load_graphs
from runner.config.compose import compose_config
from runner.engine import loop
from runner.engine.plan import compile_plan
from runner.sources.models import build_model

TRANSCODERS = ROOT / "tests" / "fixtures" / "transcoders_gpt2_tiny"
MODEL = ["model=gpt2_tiny", "model.vocab_size=61"]
#: The graph run of ``{prompts}`` random 16-token prompts (``data=tokens`` of a fixed size, one pass over them).
GRAPH = [*MODEL, "data=tokens", "data.size={prompts}", "epochs=1", "loss=none", "mode=eval",
         "hooks=[transcoder,graph]", f"hooks.transcoder.path={TRANSCODERS}", "progress=false", "quiet=true"]


@dataclass
class Sizes:
    prompts: int
    rounds: int
    bare_repeats: int  #: forward-and-backward steps timed per round (their median is the round's)

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(2, 1, 3) if quick else cls(64, 3, 20)


def graph_run(prompts: int, out: Path) -> float:
    """Seconds of one graph run over ``prompts`` prompts (its plan compiled, its tables committed)."""
    overrides = [o.format(prompts=prompts) for o in GRAPH]
    start = time.perf_counter()
    loop.run(compile_plan(compose_config(overrides), overrides), out)
    return time.perf_counter() - start


def forward_backward(model: torch.nn.Module, prompt: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward and backward of ``model`` on ``prompt`` (the sum of its logits)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(prompt).logits.sum().backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def sweep(prompts: int, where: Path) -> tuple[float, float, bool]:
    """Wall and CPU seconds of the command line's sweep sharded over two jobs, and whether the sweep's merged
    tables hold exactly its two jobs' rows."""
    argv = [sys.executable, "-m", "runner", "-m", *(o.format(prompts=prompts) for o in GRAPH),
            "data.num_shards=2", "data.shard=0,1", f"hydra.sweep.dir={where}"]
    before, start = os.times(), time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall, after = time.perf_counter() - start, os.times()
    if done.returncode != 0:
        raise RuntimeError(f"the graph sweep exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    merged = load_graphs(where)
    equal = all(_same(merged[i].drop(columns=["run_dir", "data.shard"], errors="ignore"),
                      pd.concat([load_graphs(where / job)[i] for job in ("0", "1")]))
                for i in (0, 1))
    return wall, cpu, equal


def _same(merged: pd.DataFrame, jobs: pd.DataFrame) -> bool:
    """The same rows and values, whatever their order and the loaders' dtypes."""
    columns = [c for c in jobs.columns if c in merged.columns]
    order = ["sample", "node"] if "node" in columns else ["sample", "source", "target"]
    as_rows = lambda frame: frame[columns].astype(object).sort_values(order).reset_index(drop=True)  # noqa: E731
    return len(merged) == len(jobs) and as_rows(merged).equals(as_rows(jobs))


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.graph", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts, one round: the smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    s, report = Sizes.of(args.quick), Report()
    report.say(f"## Attribution graphs: {s.prompts} prompts of 16 tokens, gpt2_tiny with a transcoder at each MLP"
               + (" (--quick: sizes too small to mean anything)" if args.quick else ""))
    model = build_model(compose_config([*MODEL, "hooks=none"]).model)
    prompt = torch.randint(0, 61, (1, 16), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"graph": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        graph_run(2, Path(tmp) / "warm-up")  # the first run in a process pays imports and first calls
        forward_backward(model, prompt, 2)
        for round_ in range(s.rounds):
            order = [("graph", lambda: graph_run(s.prompts, Path(tmp) / f"graph{round_}") / s.prompts),
                     ("bare", lambda: forward_backward(model, prompt, s.bare_repeats))]
            for name, measure in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(measure())
        wall, cpu, equal = sweep(s.prompts, Path(tmp) / "sweep")
    per_prompt, bare = statistics.median(times["graph"]), statistics.median(times["bare"])
    ratio = paired_ratio(times["graph"], times["bare"])
    report.table(f"One graph against one forward and backward ({s.rounds} round(s), in one process)",
                 ["measure", "value"],
                 [["graph, median s per prompt", f"{per_prompt:.3f}"],
                  ["forward + backward of one prompt, median s", f"{bare:.4f}"],
                  ["graph / forward + backward (paired median)", f"{ratio:.0f}"],
                  [f"sweep of {s.prompts} prompts over 2 jobs (command line), wall s", f"{wall:.1f}"],
                  [f"sweep of {s.prompts} prompts over 2 jobs (command line), CPU s", f"{cpu:.1f}"],
                  ["sweep's merged tables equal its jobs' own", "yes" if equal else "NO"]])
    config = f"gpt2_tiny, {s.prompts} prompts"
    report.add("graph", config, "graph per prompt / forward+backward", per_prompt, "s", ratio)
    report.add("graph", config, "sweep over 2 jobs, CPU", cpu, "s")
    report.write(args.out, "graph")
    if not equal:
        raise SystemExit("the sweep's merged tables differ from its jobs' own")
    return args.out


if __name__ == "__main__":
    main()
