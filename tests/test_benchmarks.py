"""Smoke run of ``python -m benchmarks.run --quick``: every measurement runs and lands in both tables.

Timings are not asserted (the machine is shared); only that each number exists and is sane.
"""
from __future__ import annotations

import argparse
import math

import pyarrow.parquet as pq
import pytest
import torch
import torchvision

from benchmarks import run as bench
from benchmarks.variants import make_variants


@pytest.mark.slow
def test_quick_benchmark_writes_every_table(tmp_path):
    out = bench.main(["--quick", "--out", str(tmp_path)])
    rows = pq.read_table(out / "results.parquet").to_pylist()
    by_section: dict[str, list[dict]] = {}
    for row in rows:
        by_section.setdefault(row["section"], []).append(row)
    assert set(by_section) == {"hook overhead", "against hand-written", "parquet write", "stats table", "start-up",
                               "peak memory", "first step", "sweep loading", "attach block", "sweep start"}
    assert all(math.isfinite(r["value"]) and r["value"] > 0 for r in rows)

    overhead = {r["name"]: r for r in by_section["hook overhead"]}
    assert overhead["bare"]["ratio"] == overhead["bare"]["cpu_ratio"] == 1.0
    assert set(bench.TARGETS) <= set(overhead)
    assert all(overhead[name]["target"] for name in bench.TARGETS)
    assert [r["name"] for r in by_section["against hand-written"]] == list(bench.AGAINST_HAND)
    assert {r["unit"] for r in by_section["against hand-written"]} == {f"of {h}" for h in bench.AGAINST_HAND.values()}
    assert {r["name"] for r in by_section["parquet write"]} == {"runner (RunOutputs)", "pyarrow alone", "raw file write"}

    markdown = (out / "results.md").read_text()
    assert "**missed**" not in markdown
    assert all(r["target"].endswith("not judged (--quick)") for r in rows if r["target"])  # tiny sizes judge nothing
    for name in overhead:
        assert f"| {name} |" in markdown
    assert "Start-up" in markdown and "Peak memory" in markdown.replace("Peak RSS", "Peak memory")
    loading = {r["name"]: r for r in by_section["sweep loading"]}
    assert set(loading) == {read for read, _, _ in bench.sweep_load.READS} | {"memory added / frame"}
    assert "Loading a sweep of 3 jobs" in markdown and "Step 0 against the run's median step" in markdown
    first = {r["config"].split()[0]: r for r in by_section["first step"]}
    assert set(first) == {"hooks=stats", "hooks=none"}, "step 0 is measured beside a run without hooks"
    assert first["hooks=stats"]["target"] and not first["hooks=none"]["target"]
    assert "### Issue 50's targets, as ratios" in markdown


@pytest.mark.slow
def test_the_attach_block_is_timed_beside_a_bare_step_and_the_durable_write_of_its_files(tmp_path):
    """A tiny smoke run of the attach section: every row timed, the block judged against its target."""
    from benchmarks import attach_block

    settings = bench.Settings.from_args(argparse.Namespace(quick=False, resnet50=False, long=False, rounds=1,
                                                           device="cpu"))
    settings.attach_rounds = 2
    report = bench.Report()
    bench.attach_blocks(report, settings)
    rows = {r["name"]: r for r in report.rows}
    assert list(rows) == list(attach_block.ROWS) and all(r["section"] == "attach block" for r in rows.values())
    assert all(r["value"] > 0 and r["unit"] == "CPU ms" for r in rows.values())
    assert rows["attach block"]["ratio"] == 1.0 and rows["attach block"]["target"].startswith("≤ 20 ms ")
    assert rows["bare step"]["value"] < rows["attach block"]["value"]  # the block holds a step and more
    assert "| attach block |" in "\n".join(report.lines)


@pytest.mark.slow
def test_the_first_job_of_a_sweep_is_timed_beside_a_sweep_of_one_job():
    """The patching sweep at ``--quick`` sizes (2 jobs) and of one job, each to job 0's first step, in CPU seconds."""
    settings = bench.Settings.from_args(argparse.Namespace(quick=True, resnet50=False, long=False, rounds=1,
                                                           device="cpu"))
    report = bench.Report()
    bench.sweep_first_step(report, settings)
    rows = {r["config"]: r for r in report.rows}
    assert list(rows) == ["2 jobs", "1 jobs"] and all(r["section"] == "sweep start" for r in rows.values())
    assert all(r["value"] > 0 and r["unit"] == "CPU s" for r in rows.values())
    assert rows["1 jobs"]["ratio"] == 1.0
    assert rows["2 jobs"]["ratio"] == rows["2 jobs"]["value"] / rows["1 jobs"]["value"]


def test_issue_50s_table_divides_this_runs_rows():
    """The summary reads the rows the sections added: the block against 20 ms, the 1,000-job load (not a 10,000-job
    one after it), the 64-job sweep's first job beyond a sweep of one job against its 3 s."""
    settings = bench.Settings.from_args(argparse.Namespace(quick=False, resnet50=False, long=True, rounds=1,
                                                           device="cpu"))
    report = bench.Report()
    for name, ms in zip(bench.attach_block.ROWS, (17.0, 0.5, 3.5)):
        report.add("attach block", "", name, ms, "CPU ms")
    report.add("sweep loading", "1,000 jobs", "4 columns", 0.6, "s", 1.25, "≤ 1.3 met")
    report.add("sweep loading", "10,000 jobs", "4 columns", 6.0, "s", 1.5, "≤ 1.3 **missed**")
    report.add("sweep start", "64 jobs", "to job 0's first step", 12.0, "CPU s", 12.0 / 8.0)
    report.add("sweep start", "1 jobs", "to job 0's first step", 8.0, "CPU s", 1.0)
    bench.issue_targets(report, settings)
    table = [line for line in report.lines if line.startswith("| ")][-3:]
    assert table[0].startswith(f"| attach block ") and f"| {17.0 / 20:.2f} | ≤ 1 | ≤ 20 ms met |" in table[0]
    assert "| load_stats, 4 columns of 1,000 jobs | 1.25 | ≤ 1.3 | ≤ 1.3 met |" in table[1]
    assert f"| {(12.0 - 8.0) / 3:.2f} |" in table[2] and "12.00 s against 8.00 s for a sweep of one job" in table[2]


def test_every_variant_leaves_the_gradients_of_bare_or_of_the_hand_written_clamp():
    """The observing variants leave bare's gradients; the runner's clip leaves those of the clamp by hand
    (which differ from bare's: the benchmark times the same edit both ways)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    variants = {v.name: v for v in make_variants(torchvision.models.resnet18(), x, bench.EXTRACT_LAYERS)}
    try:
        for v in variants.values():
            v.step()
    finally:
        for v in variants.values():
            v.close()
    grads = {name: dict(v.model.named_parameters()) for name, v in variants.items()}
    clipped = {"clip by hand", "runner clip", "runner clip (record: false)"}
    for name in set(variants) - {"bare"}:
        oracle = grads["clip by hand" if name in clipped else "bare"]
        for param, p in grads[name].items():  # equal mostly: torch.equal is a tenth of assert_close's time
            if not torch.equal(p.grad, oracle[param].grad):
                torch.testing.assert_close(p.grad, oracle[param].grad, msg=f"{name}: {param}")
    assert any(not torch.equal(p.grad, grads["bare"][param].grad) for param, p in grads["clip by hand"].items())


def test_the_interval_of_a_median_holds_it_and_narrows_with_more_rounds():
    import random
    import statistics

    assert bench.median_interval([1.02] * 9) == (1.02, 1.02, 1.02)
    noisy = random.Random(1)
    widths = []
    for rounds in (10, 400):
        ratios = [1.0 + noisy.uniform(-0.05, 0.05) for _ in range(rounds)]
        median, low, high = bench.median_interval(ratios)
        assert median == statistics.median(ratios) and low <= median <= high
        assert min(ratios) < low and high < max(ratios)  # not the range of the rounds
        widths.append(high - low)
    assert low < 1.0 < high and widths[1] < widths[0] / 3


def test_each_runner_variant_is_divided_by_its_own_hand_written_twin_round_by_round():
    """Paired per round, not a ratio of medians: round 1's 3.0 over 1.0 and round 2's 2.4 over 2.0 give the
    ratios 3 and 1.2 (median 2.1), where the medians 2.7 and 1.5 would give 1.8. The verdict is the
    interval's: wholly above 1 missed, wholly at or under met, holding 1 neither."""
    import argparse

    settings = bench.Settings.from_args(argparse.Namespace(quick=False, device="cpu", resnet50=False, long=False, rounds=20))
    times = {name: [1.0, 1.0] for pair in bench.AGAINST_HAND.items() for name in pair}
    times.update({"runner stats": [3.0, 2.4], "stats by hand": [1.0, 2.0], "runner extract (memory)": [0.5, 0.5],
                  "runner clip (record: false)": [0.9, 1.1]})
    report = bench.Report()
    bench._against_hand(report, "c", times, settings)
    got = {r["name"]: (r["ratio"], r["low"], r["high"], r["unit"], r["target"]) for r in report.rows}
    assert got["runner stats"] == (pytest.approx(2.1), 1.2, 3.0, "of stats by hand", "≤ 1 **missed**")
    assert got["runner extract (memory)"] == (0.5, 0.5, 0.5, "of extract by hand", "≤ 1 met")
    assert got["runner no-op machinery"] == (1.0, 1.0, 1.0, "of no-op hooks by hand", "≤ 1 met")
    assert got["runner clip (record: false)"] == (pytest.approx(1.0), 0.9, 1.1, "of clip by hand",
                                                  "≤ 1 within noise (the interval holds it)")
    assert "| runner stats | stats by hand | 2.100 | 1.200 – 3.000 | ≤ 1 **missed** |" in report.lines


def test_a_cuda_benchmark_without_a_gpu_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        bench.main(["--quick", "--device", "cuda"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("--device cuda: torch.cuda.is_available() is False on this machine; use --device cpu")


class Step:
    """A variant whose step only writes its name in ``events``."""

    def __init__(self, name: str, events: list[str]):
        self.name, self.events = name, events

    def step(self):
        self.events.append(self.name)


def test_every_timed_step_is_synchronized_before_and_after():
    """On CUDA a step is only queued when Python returns: the clock must wait for the device."""
    events: list[str] = []

    wall, cpu = bench.interleaved([Step("a", events), Step("b", events)], rounds=2, warmup=1, sync=lambda: events.append("sync"))
    order = events[1::3]
    assert events == [e for name in order for e in ("sync", name, "sync")]
    assert [sorted(order[i:i + 2]) for i in (0, 2, 4)] == [["a", "b"]] * 3  # the warm-up round, then 2 rounds
    assert len(wall["a"]) == len(cpu["b"]) == 2


def test_each_variant_follows_different_ones_from_round_to_round():
    """Whatever a step leaves behind (freed memory, a tool's background work) must not always land on the
    same neighbour: in a rotated order ``b`` would follow ``a`` in every round it is not first."""
    events: list[str] = []

    names = ["a", "b", "c", "d"]
    bench.interleaved([Step(n, events) for n in names], rounds=12, warmup=0)
    rounds = [events[i:i + 4] for i in range(0, len(events), 4)]
    assert all(sorted(r) == names for r in rounds)
    before = {n: {r[r.index(n) - 1] for r in rounds if r.index(n) > 0} for n in names}
    assert all(len(followed) > 1 for followed in before.values()), before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine: the CUDA mode is not timed here")
def test_quick_benchmark_on_cuda_writes_the_hook_overhead_table(tmp_path):
    out = bench.main(["--quick", "--device", "cuda", "--out", str(tmp_path)])
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert any(r["section"] == "hook overhead" and r["config"].endswith("on cuda") for r in rows)


#: Wall seconds per round the loggers' benchmark is given for each variant (its real rounds run, their
#: clock is replaced): the ratios and medians it prints are these, whatever the machine's load.
ROUND_S = {"bare": [1.0, 2.0], "stats": [2.0, 2.0]}
CONTENDER_S = [3.0, 8.0]


def _rounds_of(interleaved):
    def timed(variants, rounds, warmup, **kwargs):
        wall, cpu = interleaved(variants, rounds, warmup, **kwargs)
        return {name: ROUND_S.get(name, CONTENDER_S)[:len(times)] for name, times in wall.items()}, cpu
    return timed


@pytest.mark.slow  # a phase per logger, each with its tool's process: tens of seconds on 2 cores
def test_quick_loggers_benchmark_times_each_logger_against_stats_alone_in_a_phase_of_its_own(tmp_path, monkeypatch):
    from benchmarks import loggers
    from benchmarks.variants import wandb_installed

    monkeypatch.setattr(loggers, "interleaved", _rounds_of(loggers.interleaved))
    result = loggers.main(["--quick", "--out", str(tmp_path)])
    phases = result["phases"]
    assert set(phases) == set(loggers.LOGGERS) | ({loggers.WATCH} if wandb_installed() else set())
    for name, phase in phases.items():
        variants = phase["variants"]
        contender = "wandb.watch(log='gradients')" if name == loggers.WATCH else f"stats + {name}"
        assert set(variants) == {"bare", "stats", contender}
        steps = result["steps_per_round"]
        assert {v: (variants[v]["median_s"] * steps, variants[v]["over_bare"], variants[v]["over_stats"])
                for v in variants} == {"bare": (1.5, 1.0, 0.75), "stats": (2.0, 1.5, 1.0),
                                       contender: (5.5, 3.5, 2.75)}  # medians of 3/1, 8/2 and of 3/2, 8/2
        assert all(v["dropped_lines"] == 0 for v in variants.values())  # each variant's lines all sent
        assert variants["stats"]["cpu_s_per_step"]["logger_thread"] == 0  # no logger, no logger thread
        assert variants["bare"]["cpu_s_per_step"]["own_threads"] == 0  # torch's pool is no variant's own
    for name in loggers.LOGGERS:  # each tool's own process (its CPU counted), and no other phase's left over
        assert [child for child in phases[name]["children"] if child.startswith("python")] == ["python"], name
        assert phases[name]["variants"][f"stats + {name}"]["cpu_s_per_step"]["logger_thread"] > 0  # pickling
    # W&B's service runs in the W&B phase (the tool's own, or one an earlier test's wandb.watch started in this
    # process, whose address the tool's process inherits and uses), and none a phase started outlives it
    assert "wandb-core" in phases["wandb"]["children"]
    assert all(phases[name]["services_left"] == [] for name in loggers.LOGGERS)  # none outlives its phase
    assert (tmp_path / "loggers.json").is_file()
