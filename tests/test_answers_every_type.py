"""Every hook type's printed answer is the table computed from its run's parquet.

The types with an answerer of their own are checked where their README commands run:
``clamp`` and ``stats`` (the clip line, the largest and smallest norm), ``store`` (shards, bytes),
``patch`` (a sweep and one job), ``attribution``, ``steer``, ``logit_lens`` in
``tests/test_answers_methods.py``; ``units`` in ``tests/test_units_answer.py`` (against a float64 forward)
and ``tests/test_answers_attach_names.py``. Every other type is answered by what it recorded
(``answers.statistics.recorded_answer``): here each runs once in-process (its preset, the smallest model
it fits), and its printed lines are computed again with pandas from ``stats.parquet``: the first recorded
kind of grad_output, param_grad, grad_input, output, input; each tensor's mean l2 over the steps; the
layers whose captures are all non-finite, exactly-zero gradients or all-zero activations."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import cli
from hooks.registry import HOOK_TYPES
from runner.analysis.answers import ANSWERERS, answer_of

ROOT = Path(__file__).resolve().parents[1]
CONVNET = ("model=convnet", "steps=2", "progress=false")
#: Per type answered by its records: (entry name, command-line overrides).
RECORDING = {
    "ablate": ("ablate", (*CONVNET, "hooks=ablate", "hooks.ablate.layers=conv")),
    "backward_pre": ("backward_pre", (*CONVNET, "hooks=backward_pre")),
    "capture": ("extract", (*CONVNET, "hooks=extract", "hooks.extract.layers=[conv,fc]")),
    "custom": ("custom", (*CONVNET, "hooks=custom")),
    "edit_output": ("residual", (*CONVNET, "hooks=residual", "hooks.residual.layers=relu")),
    "full_backward": ("full_backward", (*CONVNET, "hooks=full_backward")),
    "node": ("node", (*CONVNET, "hooks=node")),
    "post_accumulate": ("post_accumulate", (*CONVNET, "hooks=post_accumulate")),
    "print": ("print", (*CONVNET, "hooks=print")),
    "replace": ("zero_bias", (*CONVNET, "hooks=zero_bias")),
    "sae": ("sae", ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2", "progress=false",
                    "hooks=sae", f"hooks.sae.path={ROOT / 'tests/fixtures/sae_standard'}")),
    "saved_tensors": ("offload", (*CONVNET, "hooks=offload")),
    "scale": ("double_grad", (*CONVNET, "hooks=double_grad")),
    "shift": ("shift", (*CONVNET, "hooks=shift")),
}
#: Types answered elsewhere (the module's doc), by the test that checks them.
ANSWERED_ELSEWHERE = {"clamp", "stats", "store", "patch", "attribution", "steer", "logit_lens", "units",
                      "dla"}  # tests/test_dla.py: the printed parts and heads against dla.parquet
GRADIENTS = ("grad_output", "param_grad", "grad_input")


def test_every_hook_type_is_checked_here_or_named_where_it_is():
    missing = set(HOOK_TYPES) - set(RECORDING) - ANSWERED_ELSEWHERE
    assert not missing, f"hook types whose printed answer no test checks against their parquet: {sorted(missing)}"
    assert not set(RECORDING) & set(ANSWERERS)  # these have no answerer of their own: their records answer


def label(layer: str, kind: str, slot: str, call: int) -> str:
    """A tensor's name as the answer writes it: ``fc``, ``fc.bias`` (a parameter), ``split[1]``, ``relu #1``."""
    name = (layer or "(model)") + (f".{slot}" if kind == "param_grad" else f"[{slot}]" if slot != "0" else "")
    return name + (f" #{call}" if call else "")


def expected_lines(run_dir: Path, entry: str) -> tuple[list[str], dict[str, float]]:
    """The entry's answer from ``stats.parquet`` by hand, and each tensor's mean l2 by name."""
    stats = pq.read_table(run_dir / "stats.parquet").to_pandas()
    rows = stats[(stats.hook == entry) & (stats.phase != "eval")]
    kinds = [k for k in (*GRADIENTS, "output", "input") if (rows.kind == k).any()]
    if not kinds:
        return [f"{len(rows)} rows of kinds {', '.join(sorted(set(rows.kind)))}"], {}
    of = rows[rows.kind == kinds[0]]
    if kinds[0] == "param_grad" and (of.phase == "after_backward").any():
        of = of[of.phase == "after_backward"]
    means = {label(layer, kinds[0], slot, call): float(group.l2.mean())
             for (layer, slot, call), group in of.groupby(["layer", "slot", "call"], sort=False)}
    what = "gradient" if kinds[0] in GRADIENTS else "activation"
    largest, smallest = max(means, key=means.get), min(means, key=means.get)
    first = (f"{what} l2 ({kinds[0]}) of {largest}: {means[largest]:.3g}" if len(means) == 1 else
             f"{what} l2 ({kinds[0]}, {len(means)} tensors): largest {largest} {means[largest]:.3g}, "
             f"smallest {smallest} {means[smallest]:.3g}")
    problems = {}
    for (layer, kind, slot), group in rows.groupby(["layer", "kind", "slot"], sort=False):
        name = label(layer, kind, slot, 0) + ("" if kind in ("output", "param_grad") else f" {kind}")
        if (group.nan_count > 0).any() or (group.inf_count > 0).any():
            problems.setdefault("non-finite", []).append(name)
        elif kind in GRADIENTS and (group.l2 == 0).all():
            problems.setdefault("zero gradient", []).append(name)
        elif kind not in GRADIENTS and (group.zero_frac == 1).all():
            problems.setdefault("all zero", []).append(name)
    second = "; ".join(f"{problem}: {', '.join(dict.fromkeys(names))}" for problem, names in problems.items())
    return [first, second or "no dead or non-finite layer"], means


@pytest.mark.parametrize("kind", sorted(RECORDING))
def test_the_printed_answer_is_the_table_of_what_the_entry_recorded(tmp_path, capsys, kind):
    entry, words = RECORDING[kind]
    cli(list(words), tmp_path / "run")
    printed = capsys.readouterr().out.splitlines()
    lines, means = expected_lines(tmp_path / "run", entry)
    named = entry if entry == kind else f"{entry} ({kind})"
    start = printed.index(next(line for line in printed if line.startswith(f"  {named}: ")))
    assert printed[start:start + len(lines)] == [f"  {named}: {lines[0]}", *(f"    {line}" for line in lines[1:])]
    table = answer_of(tmp_path / "run", entry, kind).table
    assert dict(zip(table.get("label", []), table.get("l2", []))) == pytest.approx(means, rel=1e-12)
