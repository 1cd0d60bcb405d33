"""The analysis side's small wrongs, each on runs written by hand (``written_runs``): a steering sweep's answer in
the command line's order, a sweep table's blank said in words, swept values in plain decimal, the report's
warnings and a missing path in one line, and ``unit_examples.parquet``'s own ``rank`` column kept."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from common.records import STEER, UNIT_EXAMPLES
from runner.analysis.load import load_table
from runner.analysis.report import main as report_main
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
