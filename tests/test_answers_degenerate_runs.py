"""Property test: every hook type's answer, and the report, over degenerate runs: no rows, one row, identical
rows, all NaN. Whatever hypothesis draws, the summary gives each entry a line (its answer, or what it recorded)
and the report a page; never a traceback. Each type's case writes the files an entry of that type writes
(``written_runs``), in their schemas; the types are read from the hook-type registry, so a new type without a
case here fails ``test_every_hook_type_has_a_degenerate_case``. Sweeps: one job, and a job of each state that
wrote no data beside a complete one."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.records import DLA_WHOLE, GENERATE, KINDS
from hooks.mechanism.registry import HOOK_TYPES
from runner.analysis.answers import declared_answers
from runner.analysis.report import render
from runner.analysis.summary import summarize
from common.sweep_format import WORDS
from runner.config.schema import MODE_ANSWERS
from written_runs import write_run, write_sweep_record

SHAPES = ("no rows", "one row", "identical rows", "all NaN")
NAN = math.nan


@st.composite
def degenerate_values(draw) -> list[float]:
    """The values of a degenerate run's rows: none, one, a few equal ones, or a few NaN."""
    shape = draw(st.sampled_from(SHAPES))
    value = draw(st.floats(-1e3, 1e3) | st.sampled_from([0.0, 3e-05]))
    count = {"no rows": 0, "one row": 1}.get(shape) or draw(st.integers(2, 3))
    return [NAN if shape == "all NaN" else value] * count


def stats_row(entry: str, kind: str, value: float) -> dict:
    nan = int(math.isnan(value))
    return {"step": 0, "call": 0, "hook": entry, "layer": "fc", "phase": "backward" if "grad" in kind else "forward",
            "kind": kind, "slot": "0", "tensor_shape": [1, 2], "dtype": "float32", "numel": 2, "mean": value,
            "std": value, "min": value, "max": value, "abs_mean": abs(value), "l2": abs(value), "zero_frac": 0.0 if nan
            else min(abs(value), 1.0), "nan_count": 2 * nan, "inf_count": 0}


def steps(values: list[float], *metrics: str) -> list[dict]:
    """A step per value (one, NaN loss, where there is none: a run still has its steps), each metric that value."""
    return [{"step": i, "split": "train", "loss": value, **{m: value for m in metrics}}
            for i, value in enumerate(values or [NAN])]


def recorded(kind: str):
    """A type answered by its statistics: rows of ``kind`` (drawn) from the entry."""
    def case(values, entry, draw, where):
        chosen = draw(st.sampled_from(KINDS))
        return {"stats.parquet": [stats_row(entry, chosen, v) for v in values], "steps.parquet": steps(values)}, {}
    return case


def clamp(values, entry, draw, where):
    rows = [stats_row(entry, kind, v) for v in values for kind in ("grad_output", "clipped")]
    return {"stats.parquet": rows, "steps.parquet": steps(values)}, {}


def patch(values, entry, draw, where):
    metrics = ("logit_diff", "clean_logit_diff", "corrupted_logit_diff")
    return {"steps.parquet": steps(values, *metrics)}, {"layers": "fc", "index": None, "source": "clean"}


def attribution(values, entry, draw, where):
    tensors = [{"step": 0, "call": 0, "hook": entry, "layer": "fc", "phase": "backward", "kind": "attribution",
                "slot": "0", "tensor_shape": [2], "dtype": "float32", "numel": 2, "tensor_values": [v, v]}
               for v in values]
    return {"tensors.parquet": tensors, "steps.parquet": steps(values, "logit_diff", "clean_logit_diff",
                                                               "corrupted_logit_diff")}, {"metric": "logit_diff"}


def steer(values, entry, draw, where):
    rows = [{"method": "steer", "hook": entry, "layers": ["fc"], "scale": v, "step": 0, "sample": i, "kl": v,
             "steered_top_ids": [1], "steered_top_probs": [v], "unsteered_top_ids": [1], "unsteered_top_probs": [v]}
            for i, v in enumerate(values)]
    return {"steer.parquet": rows, "steps.parquet": steps(values, "logit_diff", "corrupted_logit_diff")}, {}


def logit_lens(values, entry, draw, where):
    rows = [{"hook": entry, "layer": "h.0", "block": 0, "step": 0, "sample": i, "position": 0, "top_ids": [1],
             "top_logits": [v], "target": 1, "target_logit": v, "target_prob": v, "target_rank": 0}
            for i, v in enumerate(values)]
    return {"lens.parquet": rows, "steps.parquet": steps(values)}, {}


def dla(values, entry, draw, where):
    rows = [{"hook": entry, "step": 0, "sample": i, "position": 0, "component": part, "layer": "", "block": -1,
             "head": -1, "target": 1, "other": 2, "contribution": v, "logit_diff": v, "scale": 1.0}
            for i, v in enumerate(values) for part in DLA_WHOLE]
    return {"dla.parquet": rows, "steps.parquet": steps(values)}, {}


def graph(values, entry, draw, where):
    """A prompt per value: its token's embedding, one feature and its top logit, the edges between them of that
    weight (a NaN weight for all NaN; no prompt for no rows)."""
    node = {"hook": entry, "step": 0, "position": 0, "feature": -1, "token_id": 1, "token": "a", "activation": 0.0,
            "probability": None, "kept": True}
    nodes = [{**node, "sample": i, "node": n, "kind": kind, "layer": layer, "feature": feature, "activation": act,
              "probability": probability, "influence": v}
             for i, v in enumerate(values)
             for n, kind, layer, feature, act, probability in ((0, "feature", 0, 3, v, None), (1, "embedding", -1, -1, 0.0, None),
                                                              (2, "logit", 1, -1, v, 1.0))]
    edges = [{"hook": entry, "step": 0, "sample": i, "source": source, "target": target, "weight": v, "kept": True}
             for i, v in enumerate(values) for source, target in ((1, 0), (0, 2))]
    return {"graph_nodes.parquet": nodes, "graph_edges.parquet": edges, "steps.parquet": steps(values)}, {}


def units(values, entry, draw, where):
    rows = [{"hook": entry, "layer": "fc", "call": 0, "unit": i, "count": 1, "mean": v, "m2": 0.0, "min": v,
             "max": v, "threshold": 0.0, "above": int(v > 0), "top_k": 1, "relative_error": 0.01, "sketch_low": 1e-8,
             "sketch_high": 1e8, "sketch_mapping": "float32-linear", "sketch_index": [], "sketch_count": [],
             "top_value": [v], "top_sample": [0], "top_position": [0], "bottom_value": [v], "bottom_sample": [0],
             "bottom_position": [0], "position_shape": [], "second_moment": []} for i, v in enumerate(values)]
    return {"units.parquet": rows, "steps.parquet": steps(values)}, {}


def store(values, entry, draw, where):
    return {"stats.parquet": [stats_row(entry, "output", v) for v in values], "steps.parquet": steps(values)}, {
        "path": str(where / "stores")}


def generate(values, entry, draw, where):
    rows = [{"hook": GENERATE, "step": 0, "sample": i, "prompt": "a dog", "prompt_ids": [1, 2],
             "generated_ids": [] if math.isnan(v) else [3, 3], "generated_text": "" if math.isnan(v) else "cat cat"}
            for i, v in enumerate(values)]
    return {"generations.parquet": rows, "steps.parquet": steps(values)}, {}


OWN = {"clamp": clamp, "patch": patch, "attribution": attribution, "steer": steer, "logit_lens": logit_lens,
       "dla": dla, "graph": graph, "units": units, "store": store, GENERATE: generate}
#: Per hook type (and ``mode=generate``'s own answer), the files a degenerate entry of it writes.
CASES = {**{kind: recorded(kind) for kind in HOOK_TYPES if declared_answers(kind).run is None}, **OWN}
#: The hook types and modes that declare an answer of their own.
ANSWERING = {kind for kind in [*HOOK_TYPES, *(mode.value for mode in MODE_ANSWERS)]
             if declared_answers(kind).run is not None}


def test_every_hook_type_has_a_degenerate_case():
    missing = (set(HOOK_TYPES) | ANSWERING) - set(CASES)
    assert not missing, f"hook types without a degenerate-run case here: {sorted(missing)}"


def write_case(where: Path, kind: str, values: list[float], draw) -> Path:
    entry = "generate" if kind == GENERATE else f"my_{kind}"
    tables, spec = CASES[kind](values, entry, draw, where)
    config = {"mode": GENERATE} if kind == GENERATE else {"hooks": {entry: {"type": kind, **spec}}}
    return write_run(where / "run", tables, ["seed=0"], config)


def assert_answered(text: str, kind: str) -> None:
    """The summary of a run of one entry of ``kind``: its run line, the entry's lines, the report command."""
    lines = text.splitlines()
    named = GENERATE if kind == GENERATE else f"my_{kind} ({kind})"
    assert lines[0].startswith("run ") and lines[-1].startswith("report: python -m runner.report ")
    entry = [line for line in lines if line.startswith(f"  {named}: ")]
    assert len(entry) == 1 and entry[0].strip() != f"{named}:", text
    assert not any(word in text for word in ("Traceback", "NaN")), text


@pytest.mark.parametrize("kind", sorted(CASES))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=degenerate_values(), data=st.data())
def test_every_answer_and_the_report_of_a_degenerate_run_are_lines_and_a_page(kind, values, data):
    with tempfile.TemporaryDirectory() as where:
        run = write_case(Path(where), kind, values, data.draw)
        assert_answered(summarize(run), kind)
        page = render(run)
        assert page.startswith("<!DOCTYPE html>") and '<section id="summary">' in page


@pytest.mark.parametrize("state", sorted(set(WORDS) - {"ok"}) + [None])
def test_a_sweep_of_one_complete_job_and_one_that_wrote_nothing_is_answered_and_reported(tmp_path, state):
    """One complete job (``None``: and no other), beside a job of each state that wrote no data."""
    sweep = tmp_path / "sweep"
    write_run(sweep / "0", {"stats.parquet": [stats_row("s", "output", 1.0)], "steps.parquet": steps([1.0])},
              ["seed=0"], {"hooks": {"s": {"type": "stats"}}})
    write_sweep_record(sweep, [(["seed=0"], "ok")] + ([(["seed=1"], state)] if state else []))
    text = summarize(sweep)
    assert text.splitlines()[0] == f"sweep {sweep}: 1 complete job(s)"
    page = render(sweep)
    assert ('<p class="bad">Not complete: ' in page) == (state is not None)
