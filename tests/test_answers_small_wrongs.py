"""The analysis side's small wrongs, each on runs written by hand (``written_runs``): a steering sweep's answer in
the command line's order, a sweep table's blank said in words, swept values in plain decimal, the report's
warnings and a missing path in one line, and ``unit_examples.parquet``'s own ``rank`` column kept."""
from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from common.records import RUN_TOTAL_SCHEMAS, STEER, TABLE_SCHEMAS, UNIT_EXAMPLES
from runner.analysis.load import load_table, process_rank_column
from runner.analysis.summary import summarize
from written_runs import write_run, write_sweep_record

LAYERS = ["transformer.h.1", "transformer.h.0"]  # as the command line wrote them
SCALES = [40.0, 0.0, 0.00003]


def steering_sweep(sweep: Path) -> dict[tuple[str, float], tuple[float, float, float]]:
    """A steering sweep, layers x scales in Hydra's job order; per (layer, scale): its KL, top-token change, metric."""
    expected = {}
    for num, (layer, scale) in enumerate(itertools.product(LAYERS, SCALES)):
        kls = [0.01 * (num + 1), 0.03 * (num + 1)]
        changed = [[1 + num % 2], [2]]  # sample 0's top token changes in odd jobs, sample 1's never
        steer = [{"method": "steer", "hook": "steer", "layers": [layer], "scale": scale, "step": 0, "sample": s,
                  "kl": kls[s], "steered_top_ids": changed[s], "steered_top_probs": [0.5],
                  "unsteered_top_ids": [1 + s], "unsteered_top_probs": [0.5]} for s in (0, 1)]
        steps = [{"step": 0, "split": "train", "loss": math.nan, "logit_diff": 0.5 + num, "corrupted_logit_diff": 0.25}]
        write_run(sweep / str(num), {STEER: steer, "steps.parquet": steps},
                  [f"hooks.steer.layers={layer}", f"hooks.steer.scale={scale:f}".rstrip("0").rstrip(".")],
                  {"hooks": {"steer": {"type": "steer"}}})
        expected[(layer, scale)] = (float(np.mean(kls)), float(np.mean([c[0] != s + 1 for s, c in enumerate(changed)])),
                                    0.5 + num)
    return expected


def test_a_steering_sweep_s_answer_keeps_the_command_line_s_order_of_layers_and_scales(tmp_path):
    expected = steering_sweep(tmp_path / "sweep")
    lines = summarize(tmp_path / "sweep").splitlines()
    start = lines.index("  steering, per layer and scale: KL(unsteered || steered) of the next token, how often its "
                        "top token changed, logit_diff steered (unsteered)")
    written = {40.0: "40", 0.0: "0", 0.00003: "0.00003"}  # plain decimal, as written: never 3e-05
    assert lines[start + 1:start + 7] == [
        f"  {layer} scale {written[scale]}: KL {kl:.3g}, top token changed {100 * changed:.0f}%, {metric:.4g} (0.25)"
        for (layer, scale), (kl, changed, metric) in expected.items()]


def stats_row(kind: str, l2: float, layer: str = "fc") -> dict:
    return {"step": 0, "call": 0, "hook": "stats", "layer": layer, "phase": "forward" if kind == "output" else "backward",
            "kind": kind, "slot": "0", "tensor_shape": [2, 5], "dtype": "float32", "numel": 10, "mean": 0.0,
            "std": 1.0, "min": -1.0, "max": 1.0, "abs_mean": 0.5, "l2": l2, "zero_frac": 0.0, "nan_count": 0,
            "inf_count": 0}


def test_a_sweep_table_says_what_its_blank_means_and_writes_swept_values_in_plain_decimal(tmp_path):
    """Three learning rates; the last job recorded no grad_output (the headline column): its cell is a dash, and a
    line under the table names the job and why; the rates read as written, never 3e-05; no NaN anywhere."""
    sweep = tmp_path / "sweep"
    rates, losses, grads = ["0.00003", "0.001", "0.1"], [2.5, 1.25, 0.75], [1.0, 3.0, None]
    for num, (rate, loss, grad) in enumerate(zip(rates, losses, grads)):
        stats = [stats_row("output", 7.0)] + ([stats_row("grad_output", grad)] if grad is not None else [])
        write_run(sweep / str(num), {"stats.parquet": stats, "steps.parquet": [{"step": 0, "split": "train", "loss": loss}]},
                  ["hooks=stats", f"optim.lr={rate}"], {"hooks": {"stats": {"type": "stats"}}})
    lines = summarize(sweep).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["optim.lr", "loss"])
    assert lines[header].split() == ["optim.lr", "loss", "largest", "grad_output", "l2"]
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert rows == [[rate, f"{loss:.4g}", f"{grad:.4g}" if grad is not None else "—"]
                    for rate, loss, grad in zip(rates, losses, grads)]
    assert lines[header + 4] == "  — under largest grad_output l2: job 2 recorded no grad_output"
    assert lines[header + 5] == "  the same in every job: largest output l2 7"
    assert not any(word in line for line in lines for word in ("NaN", "nan", "e-05"))


def test_a_generation_sweep_labels_its_jobs_in_plain_decimal(tmp_path):
    for num, scale in enumerate(["0.00003", "0.1"]):
        write_run(tmp_path / "sweep" / str(num), {"generations.parquet": [
            {"hook": "generate", "step": 0, "sample": 0, "prompt": "a dog", "prompt_ids": [1, 2], "generated_ids": [3 + num],
             "generated_text": f"word{num}"}]}, [f"hooks.steer.scale={scale}"], {"mode": "generate"})
    lines = summarize(tmp_path / "sweep").splitlines()
    assert lines[1:5] == ["  generated text of 2 job(s) by hooks.steer.scale, per prompt", "  'a dog':",
                          "    hooks.steer.scale=0.00003: 'word0'", "    hooks.steer.scale=0.1: 'word1'"]


def report(*argv: str) -> subprocess.CompletedProcess:
    """``python -m runner.report ARGV`` as the user runs it: its status and what it printed."""
    return subprocess.run([sys.executable, "-m", "runner.report", *argv], capture_output=True, text=True, timeout=300)


def test_the_report_of_an_incomplete_sweep_prints_its_warning_as_one_clean_line(tmp_path):
    sweep = tmp_path / "sweep"
    write_run(sweep / "0", {"stats.parquet": [stats_row("output", 7.0)],
                            "steps.parquet": [{"step": 0, "split": "train", "loss": 1.0}]},
              ["hooks=stats", "seed=0"], {"hooks": {"stats": {"type": "stats"}}})
    write_sweep_record(sweep, [(["hooks=stats", "seed=0"], "ok"), (["hooks=stats", "seed=1"], "failed")])
    done = report(str(sweep))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{sweep / 'report.html'}\n"
    assert done.stderr == (f"warning: {sweep}: 2 jobs: 1 complete, 1 failed (job 1: seed=1); "
                           "reading the 1 complete run(s)\n")


def test_the_report_of_a_path_that_does_not_exist_says_so_in_one_line(tmp_path, capsys):
    """``runner.report.main`` in this process (the real process's lines: the test above)."""
    import runner.report

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        runner.report.main([str(tmp_path / "nowhere")])
    printed = capsys.readouterr()
    assert (exit_.value.code, printed.out) == (2, "")
    assert printed.err == f"error: '{tmp_path / 'nowhere'}' does not exist: no complete run there\n"
    assert not (tmp_path / "nowhere").exists()


def test_load_table_keeps_unit_examples_own_rank_and_adds_the_process_s_under_a_name_no_file_has(tmp_path):
    examples = [{"hook": "units", "layer": "fc", "call": 0, "unit": 3, "rank": place, "sample": 10 + place,
                 "value": 1.0 - place, "position": 0, "map_shape": [], "map": []} for place in range(3)]
    run = write_run(tmp_path / "run", {UNIT_EXAMPLES: examples, "steps.parquet": []})
    rows = load_table(run, UNIT_EXAMPLES)
    assert list(rows["rank"]) == [0, 1, 2] == list(pq.read_table(run / UNIT_EXAMPLES).column("rank").to_pylist())
    assert list(rows["part_rank"]) == [0, 0, 0]  # the process that recorded them: not distributed
    assert list(load_table(run, UNIT_EXAMPLES, filters=[("rank", "=", 5)]).columns) == list(rows.columns)
    for name, schema in {**TABLE_SCHEMAS, **RUN_TOTAL_SCHEMAS}.items():
        assert process_rank_column(name) not in schema.names, name
