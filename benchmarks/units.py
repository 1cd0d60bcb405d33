"""``python -m benchmarks.units``: whole-dataset passes against their bare baselines, as ratios in one run.

* ``units`` on every Conv2d and Linear output of resnet18 against bare inference (target <= 1.15
  at batch 64), interleaved rounds, median of the paired ratios (``benchmarks.run.interleaved``);
* an activation store's write throughput against writing the same bytes raw, fsynced per shard
  (target >= 0.8), and its read-back into torch tensors against a plain ``np.memmap`` read (>= 0.8);
* peak memory of a store pass over a dataset and over four times that dataset (target: flat,
  ratio <= 1.1), each in a fresh process;
* ``stop_after=layer2`` against the whole forward (the saving: 1 - ratio).

    python -m benchmarks.units            # batch 64 at 224 px, stores of 256 MiB (minutes)
    python -m benchmarks.units --quick    # tiny sizes, one round: the smoke test

Tables go to ``benchmarks/results/units.md`` and ``units.parquet`` (``--out`` elsewhere).
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torchvision

from benchmarks.run import RESULTS, Report, interleaved, paired_ratio
from hooks import HookSession, build_hooks
from hooks.formats.store_files import ShardWriter
from runner.engine.early_stop import forward_until_stop, stopping
from runner.engine.memory import PeakMemory
from runner.store.activations import ActivationStore

TARGETS = {"units": "<= 1.15", "store write": ">= 0.8", "store read": ">= 0.8", "peak memory": "<= 1.1"}


@dataclass
class Sizes:
    batch: int
    side: int
    rounds: int
    warmup: int
    store_mib: int
    shard_rows: int
    memory_batches: int     #: the smaller pass's batches (the larger one: four times as many)
    memory_batch: int
    memory_side: int
    memory_shard_rows: int  #: small enough that both passes fill several shards

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(2, 32, 1, 1, 2, 64, 2, 2, 32, 2) if quick else cls(64, 224, 10, 2, 256, 1024, 8, 16, 112, 32)


@dataclass
class Variant:
    name: str
    step: object


def _resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval()


def units_overhead(report: Report, s: Sizes) -> None:
    """Bare inference, the same with ``units`` on every Conv2d and Linear output, and with ``stop_after=layer2``."""
    bare_model, units_model, stop_model = _resnet(), _resnet(), _resnet()
    x = torch.randn(s.batch, 3, s.side, s.side)
    hooks = build_hooks({"units": {"type": "units", "layers": ["type:Conv2d", "type:Linear"]}})
    with contextlib.ExitStack() as stack, torch.no_grad():
        session = stack.enter_context(HookSession(units_model, hooks))
        stack.enter_context(stopping(stop_model, "layer2", []))
        steps = itertools.count()

        def units_step() -> None:  # each forward a step of its own, as in a pass: call 0 of every layer
            session.begin_step(next(steps))
            units_model(x)

        variants = [Variant("bare", lambda: bare_model(x)), Variant("units", units_step),
                    Variant("stop_after=layer2", lambda: forward_until_stop(stop_model, x))]
        wall, cpu = interleaved(variants, s.rounds, s.warmup)
    rows = []
    for name in ("units", "stop_after=layer2"):
        ratio, cpu_ratio = paired_ratio(wall[name], wall["bare"]), paired_ratio(cpu[name], cpu["bare"])
        rows.append([name, f"{statistics.median(wall[name]) * 1e3:.1f}", f"{ratio:.3f}", f"{cpu_ratio:.3f}",
                     TARGETS.get(name, f"saving {1 - ratio:.0%}")])
        report.add("units pass", f"resnet18 b{s.batch} {s.side}px", name, statistics.median(wall[name]), "s/step",
                   ratio, TARGETS.get(name, ""), cpu_ratio)
    report.table(f"Per-unit statistics and early stop, resnet18 batch {s.batch} at {s.side} px "
                 f"(bare {statistics.median(wall['bare']) * 1e3:.1f} ms)",
                 ["variant", "median ms", "ratio to bare", "CPU-time ratio", "target"], rows)


def _write_raw(path: Path, batches: list[torch.Tensor], shard_rows: int) -> None:
    """The same bytes as the store, one file per shard, fsynced: the baseline."""
    rows = torch.cat(batches)
    for i, first in enumerate(range(0, len(rows), shard_rows)):
        with open(path / f"raw-{i}", "wb") as f:
            f.write(rows[first:first + shard_rows].numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())


def _write_store(path: Path, batches: list[torch.Tensor], shard_rows: int) -> None:
    writer = ShardWriter(path, "layer", shard_rows, "float32")
    first = 0
    for batch in batches:
        writer.add(batch, torch.arange(first, first + len(batch)))
        first += len(batch)
    writer.finish()


def store_io(report: Report, s: Sizes) -> None:
    """Store write and read-back throughput against raw files of the same bytes."""
    width = 4096
    rows = s.store_mib * (1 << 20) // (4 * width)
    batches = list(torch.randn(rows, width).split(64))
    nbytes = rows * width * 4
    times: dict[str, list[float]] = {k: [] for k in ("raw write", "store write", "memmap read", "store read")}
    for r in range(s.warmup + s.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            raw, store = Path(tmp) / "raw", Path(tmp) / "store"
            raw.mkdir()
            for name, fn in (("raw write", lambda: _write_raw(raw, batches, s.shard_rows)),
                             ("store write", lambda: _write_store(store, batches, s.shard_rows)),
                             ("memmap read", lambda: _read_raw(raw, width)),
                             ("store read", lambda: _read_store(store))):
                start = time.perf_counter()
                fn()
                if r >= s.warmup:
                    times[name].append(time.perf_counter() - start)
    rows_out = []
    for name, base in (("store write", "raw write"), ("store read", "memmap read")):
        ratio = paired_ratio(times[base], times[name])  # throughput ratio: baseline time / store time
        rate = nbytes / statistics.median(times[name]) / (1 << 20)
        rows_out.append([name, f"{rate:.0f}", f"{ratio:.3f}", TARGETS[name]])
        report.add("store", f"{s.store_mib} MiB", name, rate, "MiB/s", ratio, TARGETS[name])
    report.table(f"Activation store, {s.store_mib} MiB in shards of {s.shard_rows} rows",
                 ["operation", "MiB/s", "throughput ratio to raw", "target"], rows_out)


def _read_raw(path: Path, width: int) -> list[torch.Tensor]:
    return [torch.from_numpy(np.array(np.memmap(f, np.float32, "r").reshape(-1, width)))
            for f in sorted(path.iterdir())]


def _read_store(path: Path) -> list[torch.Tensor]:
    store = ActivationStore(path)
    return [store.shard(i)[0] for i in range(len(store.rows))]


def _store_pass_peak(batches: int, batch: int, side: int, shard_rows: int, queue) -> None:
    """In a fresh process: a store pass of resnet18 ``layer3`` over ``batches`` batches; its peak RSS.

    ``VmHWM`` (``PeakMemory``), not ``ru_maxrss``: Linux carries ``ru_maxrss`` over ``fork`` and
    ``exec`` from the parent, whose gigabytes then hide the pass (both sizes measured the parent)."""
    model = _resnet()
    peak = PeakMemory(torch.device("cpu"))
    peak.reset()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        writer = ShardWriter(Path(tmp), "layer3", shard_rows, "float16")
        for i in range(batches):
            out = model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(
                torch.randn(batch, 3, side, side))))))))
            writer.add(out, torch.arange(i * batch, (i + 1) * batch))
        writer.finish()
    queue.put(peak.peak_bytes())


def peak_memory(report: Report, s: Sizes) -> None:
    """Peak memory of a store pass over a dataset and over four times it: flat means bounded by the shard."""
    context = multiprocessing.get_context("spawn")
    peaks = {}
    for batches in (s.memory_batches, 4 * s.memory_batches):
        queue = context.Queue()
        child = context.Process(target=_store_pass_peak,
                                args=(batches, s.memory_batch, s.memory_side, s.memory_shard_rows, queue))
        child.start()
        peaks[batches] = queue.get()
        child.join()
    small, large = peaks[s.memory_batches], peaks[4 * s.memory_batches]
    ratio = large / small
    report.add("memory", f"store pass {s.memory_batches} vs {4 * s.memory_batches} batches", "peak RSS", large,
               "bytes", ratio, TARGETS["peak memory"])
    report.table(f"Peak memory of a store pass (resnet18 layer3, float16, batch {s.memory_batch} at "
                 f"{s.memory_side} px, shards of {s.memory_shard_rows} rows)",
                 ["batches", "peak RSS MiB", "ratio to the smaller", "target"],
                 [[str(s.memory_batches), f"{small / (1 << 20):.0f}", "1.000", ""],
                  [str(4 * s.memory_batches), f"{large / (1 << 20):.0f}", f"{ratio:.3f}", TARGETS["peak memory"]]])


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.units", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: the smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes, report = Sizes.of(args.quick), Report()
    report.say("## Whole-dataset passes" + (" (--quick: sizes too small to mean anything)" if args.quick else ""))
    units_overhead(report, sizes)
    store_io(report, sizes)
    peak_memory(report, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "units.md").write_text("\n".join(report.lines) + "\n")
    pq.write_table(pa.Table.from_pylist(report.rows), args.out / "units.parquet")
    return args.out


if __name__ == "__main__":
    main()
