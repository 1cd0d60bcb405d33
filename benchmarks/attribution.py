"""``python -m benchmarks.attribution``: one attribution run against the patching sweep it estimates, as a ratio.

The sweep is the README's: ``gpt2_tiny`` with 4 blocks, each block at each of 16 positions patched
from each job's own clean pass (``hooks.patch.source=clean``), 64 jobs; the attribution run is
``hooks=attribution`` on the same 4 blocks, every cell at once from one clean pass, one corrupted
pass and one backward. Both go through the runner's own plan and loop in this process
(``compile_plan`` and ``loop.run``: a job's work without Python's start-up, which the sweep would
pay 64 times over), alternated round by round; the ratio is the sweep's time over the attribution
run's, the median of the rounds' (paired), after one untimed attribution run and patching job (the
first run in a process pays the imports and first calls that every later one skips). The
correlation of the estimate's recovered fractions with the sweep's
(``runner.analysis.patching.attribution_against_patching``) is computed and printed too: it does not
depend on the machine.

    python -m benchmarks.attribution                 # 4 blocks x 16 positions, 3 rounds
    python -m benchmarks.attribution --quick         # 1 block x 2 positions, one round: the smoke test
    python -m benchmarks.attribution --picture F.png # also the heatmaps and the scatter of the last round
    python -m benchmarks.attribution --rounds 1      # one round (the correlation needs no more)

Tables go to ``benchmarks/results/attribution.md`` and ``attribution.parquet`` (``--out`` elsewhere).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.run import RESULTS, Report, paired_ratio
from runner.analysis.patching import attribution_against_patching, patching_table
from runner.config.compose import compose_config
from runner.engine import loop
from runner.engine.plan import compile_plan

#: The README's runs (``python -m runner ...``), as overrides.
GPT = ["model=gpt2_tiny", "data=tokens", "data.seed=1", "loss=none", "mode=eval", "metric.diff=[3,4]",
       "progress=false"]


@dataclass
class Sizes:
    blocks: int
    positions: range
    rounds: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(1, range(14, 16), 1) if quick else cls(4, range(0, 16), 3)


def _job(overrides: list[str], out: Path) -> None:
    """What one job of ``python -m runner`` does once its config is composed: the plan, then the run."""
    loop.run(compile_plan(compose_config(overrides), overrides), out)


def attribution_run(s: Sizes, out: Path) -> float:
    """The attribution run of every block; its seconds."""
    start = time.perf_counter()
    _job([*GPT, f"model.n_layer={s.blocks}", "hooks=attribution", r"hooks.attribution.layers=re:transformer\.h\.\d+"],
         out)
    return time.perf_counter() - start


def patching_sweep(s: Sizes, out: Path) -> float:
    """The real patching sweep, one job per block and position; its seconds."""
    start = time.perf_counter()
    for block in range(s.blocks):
        for position in s.positions:
            _job([*GPT, f"model.n_layer={s.blocks}", "hooks=patch", "hooks.patch.source=clean",
                  f"hooks.patch.layers=transformer.h.{block}", f"hooks.patch.index={position}"],
                 out / f"{block}_{position}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attribution", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 block x 2 positions, one round: the smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--picture", type=Path, help="save the last round's heatmaps and scatter here (PNG)")
    parser.add_argument("--rounds", type=int, help="rounds to time (default 3; --quick: 1)")
    args = parser.parse_args(argv)
    s, report = Sizes.of(args.quick), Report()
    s.rounds = args.rounds or s.rounds
    cells = s.blocks * len(s.positions)
    report.say(f"## Attribution patching against the sweep it estimates: gpt2_tiny, {s.blocks} blocks x "
               f"{len(s.positions)} positions" + (" (--quick: sizes too small to mean anything)" if args.quick else ""))
    times: dict[str, list[float]] = {"attribution": [], "sweep": []}
    with tempfile.TemporaryDirectory() as tmp:  # warm-up, untimed: one attribution run and one patching job
        attribution_run(s, Path(tmp) / "attribution")
        _job([*GPT, f"model.n_layer={s.blocks}", "hooks=patch", "hooks.patch.source=clean",
              "hooks.patch.layers=transformer.h.0", f"hooks.patch.index={s.positions[-1]}"], Path(tmp) / "sweep")
    for round_ in range(s.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            order = [("attribution", attribution_run), ("sweep", patching_sweep)]
            for name, measure in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(measure(s, Path(tmp) / name))
            table = patching_table(Path(tmp))
            if args.picture is not None and round_ == s.rounds - 1:
                from runner.analysis.plots import patching_heatmap, save_png
                save_png(patching_heatmap(table), args.picture)
    both, r = attribution_against_patching(table)
    ratio = paired_ratio(times["sweep"], times["attribution"])
    report.table(f"{cells} patching jobs against one attribution run ({s.rounds} round(s), in one process)",
                 ["measure", "value"],
                 [["attribution run, median s", f"{statistics.median(times['attribution']):.2f}"],
                  [f"patching sweep ({cells} jobs), median s", f"{statistics.median(times['sweep']):.2f}"],
                  ["sweep / attribution (paired median)", f"{ratio:.1f}"],
                  [f"correlation of recovered fractions ({len(both)} cells)", f"{r:.3f}"]])
    report.add("attribution", f"gpt2_tiny {s.blocks}x{len(s.positions)}", "sweep / attribution",
               statistics.median(times["sweep"]), "s", ratio)
    report.add("attribution", f"gpt2_tiny {s.blocks}x{len(s.positions)}", "correlation", r, "pearson r")
    report.write(args.out, "attribution")
    return args.out


if __name__ == "__main__":
    main()
