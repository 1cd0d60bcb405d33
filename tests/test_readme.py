"""The tutorial table (docs/tutorials/classic-hooks.md) is a test: every command line in it runs as written.

Each ``python -m runner ...`` in a row of the table is split as a shell would split it
(``shlex.split``), ``python -m runner`` is dropped, and the overrides run in-process (the
``run_with`` fixture: the same config check and plan as the CLI). What a row claims in numbers is
tested against hand-written PyTorch in ``tests/test_tutorials.py`` and ``tests/test_seeds.py`` at the
table's sizes; here what each row says it gives (``PROMISES``) is checked on the row's own run, against
plain PyTorch where the row names a value.
"""
from __future__ import annotations

import math
import re
import tomllib
import shlex
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import runner.analysis as analysis
from conftest import seeded_batch
from docs_text import blocks, section
from examples import seed_hooks
from runner.sources.models import ConvNet

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]

#: Resnets at the table's default input (batch 10, 224x224) take seconds each on a CPU; the rows
#: with a resnet (named, or the default resnet18) run here at batch 1, 64x64, appended last so it
#: wins. The hooks, layers and kinds are the same; only the sizes shrink.
SMALL_RESNET_INPUT = "data.shape=[1,3,64,64]"


def tutorial_rows() -> list[str]:
    """The table rows of the section "The tutorials, one command line each" (header excluded)."""
    table = section("tutorials/classic-hooks.md", "The classic hook tutorials, one command each")
    rows = [line for line in table.splitlines() if line.startswith("|")]
    return rows[2:]  # the header and the |---| line


def commands_of(row: str) -> list[str]:
    """Every ``python -m runner ...`` code span of a row, from ``python`` on (an env prefix stays out)."""
    spans = re.findall(r"`([^`]*python -m runner [^`]*)`", row)
    return [span[span.index("python -m runner"):] for span in spans]


COMMANDS = [command for row in tutorial_rows() for command in commands_of(row)]


def overrides_of(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "runner"], command
    overrides = words[3:]
    model = next((w.split("=", 1)[1] for w in overrides if w.startswith("model=")), "resnet18")
    if model.startswith("resnet"):
        overrides.append(SMALL_RESNET_INPUT)
    return overrides


def test_every_row_of_the_tutorial_table_has_a_command_line():
    rows = tutorial_rows()
    assert len(rows) >= 20
    assert [row for row in rows if not commands_of(row)] == []


def _rows(run_dir: Path, **where):
    rows = analysis.load_stats(run_dir)
    for key, value in where.items():
        rows = rows[rows[key] == value]
    return rows.reset_index(drop=True)


def _one(run_dir: Path, **where):
    rows = _rows(run_dir, **where)
    assert len(rows) == 1, (where, rows)
    return rows.iloc[0]


def _seeded(build, *shape):
    """The model the run built (torch's seed 0 before building) and the first batch it drew."""
    torch.manual_seed(0)
    return build(), seeded_batch(list(shape))


def _meta(build) -> nn.Module:
    """A model's structure, nothing computed (its modules' and parameters' names)."""
    with torch.device("meta"):
        return build()


def _resnet50_printed(run_dir, out):
    printed = [line.split(":")[0] for line in out.splitlines() if ": torch.Size" in line]
    assert printed == [name for name, _ in _meta(torchvision.models.resnet50).named_children()]
    assert "fc: torch.Size([1, 1000])" in out and "avgpool: torch.Size([1, 2048, 1, 1])" in out


def _resnet50_extracted(run_dir, out):
    tensors = analysis.load_tensors(run_dir).set_index("layer").tensor
    assert {name: t.shape for name, t in tensors.items()} == {"layer4": (1, 2048, 2, 2), "avgpool": (1, 2048, 1, 1)}


def _log_mean_clipped(run_dir, out):
    """The loss is NaN (log of negative logits), said once; every param_grad within ±0.01 and finite."""
    assert math.isnan(analysis.load_steps(run_dir).loss.iloc[0])
    assert out.count("warning: step 0: the loss is nan while every hooked tensor was finite") == 1
    grads = _rows(run_dir, kind="param_grad")
    assert len(grads) == 2 * len(list(_meta(torchvision.models.resnet50).parameters()))  # backward, after_backward
    assert (grads.nan_count == 0).all() and (grads.inf_count == 0).all()
    assert grads["min"].min() >= -0.01 * (1 + 1e-7) and grads["max"].max() <= 0.01 * (1 + 1e-7)


def _zero_bias(run_dir, out):
    rows = _rows(run_dir, layer="fc", slot="bias", kind="param_grad")
    assert set(rows.phase) == {"backward", "after_backward"} and (rows.l2 == 0).all()


def _bias_before_zeroing(run_dir, out):
    """The recording entry shows fc.bias's gradient before the hook: -1/5 each (one_minus_mean of 5 outputs)."""
    row = _one(run_dir, layer="fc", slot="bias", kind="param_grad")
    assert row["min"] == row["max"] == pytest.approx(-1 / 5)


def _shifted_input(run_dir, out):
    _, x = _seeded(lambda: nn.Linear(3, 3), 2, 3)
    assert _one(run_dir, hook="shift", kind="input")["mean"] == pytest.approx((x + 1).mean().item())


def _residual_output(run_dir, out):
    m, x = _seeded(lambda: nn.Linear(3, 3), 2, 3)
    expected = (m(x) + x).detach()
    row = _one(run_dir, hook="residual", kind="output")
    assert (row["mean"], row["max"]) == (pytest.approx(expected.mean().item()), pytest.approx(expected.max().item()))


def _relu_gradient_clamped(run_dir, out):
    assert _one(run_dir, hook="clip", layer="relu", kind="grad_output")["min"] >= 0
    assert _one(run_dir, hook="stats", layer="conv", kind="grad_output")["min"] >= 0


def _doubled_gradient(run_dir, out):
    row = _one(run_dir, hook="double_grad", layer="fc", kind="grad_output")  # 1 each without the hook
    assert row["min"] == row["max"] == 2.0


def _printed_gradient(run_dir, out):
    assert "fc grad_output[0]: torch.Size([1, 5]) tensor([[1., 1., 1., 1., 1.]])" in out.splitlines()


def _grad_input_replaced(run_dir, out):
    row = _one(run_dir, kind="grad_input")
    assert row["min"] == row["max"] == 42.0


CONVNET_LEAVES = {"conv", "relu", "flatten", "fc"}


def _every_leafs_grad_input_and_output(run_dir, out):
    assert set(_rows(run_dir, kind="grad_output").layer) == CONVNET_LEAVES
    assert set(_rows(run_dir, kind="grad_input").layer) == CONVNET_LEAVES - {"conv"}  # the data needs no gradient


def _every_leafs_grad_output(run_dir, out):
    assert list(_rows(run_dir, kind="grad_output").layer) == ["fc", "flatten", "relu", "conv"]  # backward's order


def _every_module_call(run_dir, out):
    modules = {name for name, _ in _meta(torchvision.models.resnet18).named_modules()}  # "" is the model itself
    for kind in ("output", "grad_output"):
        assert set(_rows(run_dir, kind=kind).layer) == modules, kind


def _accumulated_grads(run_dir, out):
    rows = _rows(run_dir, kind="param_grad")
    assert set(zip(rows.layer, rows.slot)) == {(m, p) for m in ("fc1", "fc2") for p in ("weight", "bias")}
    assert _one(run_dir, layer="fc2", slot="bias")["mean"] == 1.0  # sum of 5 outputs: 1 each


def _one_saved_row_per_packed_tensor(run_dir, out):
    model, x = _seeded(torchvision.models.resnet18, 1, 3, 64, 64)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.numel()) or t, lambda t: t):
        model(x)
    assert len(_rows(run_dir, kind="saved")) == len(packed)


MLP_SAVED = 4  # fc1's input, relu's output, fc2's input and weight


def _packing_printed(run_dir, out):
    assert (out.count("packing: tensor("), out.count("unpacking: tensor(")) == (2 * MLP_SAVED, MLP_SAVED)
    assert len(_rows(run_dir, kind="saved")) == MLP_SAVED


def _packed_times_four(run_dir, out):
    _, x = _seeded(lambda: None, 1, 100)
    assert _one(run_dir, layer="fc1", slot="0", kind="saved")["max"] == pytest.approx(4 * x.max().item())


def _stored_in_list(run_dir, out):
    assert len(seed_hooks.STORAGE) == len(_rows(run_dir, kind="saved")) == MLP_SAVED


def _offloaded_above_a_size(run_dir, out):
    rows = _rows(run_dir, kind="saved")
    assert len(rows) == MLP_SAVED and _one(run_dir, layer="fc2", slot="1").numel == 1000


def _keyword_argument_added(run_dir, out):
    from models_for_tests import KwargsNet

    net, x = _seeded(KwargsNet, 2, 3)
    expected = net.scale(hidden=net.fc1(x), factor=3.0).detach() + 3.0
    assert _one(run_dir, hook="kw", layer="scale")["mean"] == pytest.approx(expected.mean().item())


def _printed_once(run_dir, out):
    assert out.count("layer: Linear(in_features=100, out_features=200, bias=True)") == 1
    rows = _rows(run_dir)
    assert list(rows.step) == [0] and list(rows.kind) == ["output"]


def _clipped_to_one(run_dir, out):
    grads = _rows(run_dir, kind="param_grad")
    assert len(grads) == 8 and grads["min"].min() >= -1 and grads["max"].max() <= 1
    bias = _one(run_dir, layer="fc2", slot="bias", kind="param_grad", phase="after_backward")
    assert bias["min"] == bias["max"] == 1.0


def _every_conv2d(run_dir, out):
    convs = [name for name, m in _meta(torchvision.models.resnet34).named_modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 36 and list(analysis.load_tensors(run_dir).layer) == convs


def _node_gradients(run_dir, out):
    assert set(_rows(run_dir, kind="grad_output").layer) == CONVNET_LEAVES
    fc = _rows(run_dir, layer="fc", kind="grad_input")  # AddmmBackward's inputs: bias, the flattened input, weight
    assert len(fc) == 3 and fc.iloc[0]["min"] == fc.iloc[0]["max"] == 1.0


def _every_leaf_statistics(run_dir, out):
    model = _meta(torchvision.models.resnet18)
    leaves = {name for name, m in model.named_modules() if not list(m.children())}
    outputs, grads = _rows(run_dir, kind="output"), _rows(run_dir, kind="grad_output")
    assert set(outputs.layer) == set(grads.layer) == leaves and len(outputs) == len(grads) == 60  # relus twice


def _channels_ablated(run_dir, out):
    net, x = _seeded(ConvNet, 1, 3, 8, 8)
    ablated = net.conv(x).detach()
    ablated[:, [3, 7]] = 0
    row = _one(run_dir, hook="ablate", layer="conv")
    assert (row["mean"], row["zero_frac"]) == (pytest.approx(ablated.mean().item()),
                                               pytest.approx((ablated == 0).float().mean().item()))


#: What each row of the table promises, checked on its run (the runs are at the sizes overrides_of gives),
#: by the words that tell its command line apart.
PROMISES = {
    "loss=none hooks=print": _resnet50_printed, "resnet50 data=ones loss=none hooks=extract": _resnet50_extracted,
    "loss=log_mean hooks=clip": _log_mean_clipped, "hooks=zero_bias": _zero_bias,
    "hooks.post_accumulate.layers=fc": _bias_before_zeroing, "hooks=shift": _shifted_input,
    "hooks=residual": _residual_output, "hooks.clip.layers=relu": _relu_gradient_clamped,
    "hooks=double_grad": _doubled_gradient, "hooks=print_grad": _printed_gradient,
    "hooks.full_backward.replace=42": _grad_input_replaced,
    "model=convnet hooks=full_backward": _every_leafs_grad_input_and_output,
    "hooks=backward_pre": _every_leafs_grad_output, "hooks=global_stats": _every_module_call,
    "model=mlp hooks=post_accumulate": _accumulated_grads, "python -m runner hooks=offload": _one_saved_row_per_packed_tensor,
    "print_unpacking": _packing_printed, "times_four": _packed_times_four, "store_in_list": _stored_in_list,
    "min_bytes=4000": _offloaded_above_a_size, "KwargsNet": _keyword_argument_added, "max_calls=1": _printed_once,
    "hooks.clip.min=-1": _clipped_to_one, "type:Conv2d": _every_conv2d, "hooks=node": _node_gradients,
    "python -m runner hooks=stats": _every_leaf_statistics, "hooks=ablate": _channels_ablated,
}


def promise_of(command: str):
    found = [check for words, check in PROMISES.items() if words in command]
    assert len(found) == 1, f"{command}: {len(found)} promises match (one per row)"
    return found[0]


def test_every_command_line_of_the_table_has_one_promise_checked():
    assert [promise_of(c) for c in COMMANDS] == list(PROMISES.values())


@pytest.mark.parametrize("command", COMMANDS, ids=[c[len("python -m runner "):] for c in COMMANDS])
def test_tutorial_command_runs_as_written_and_gives_what_its_row_says(run_with, capsys, command):
    seed_hooks.STORAGE.clear()
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            run_dir = run_with(*overrides_of(command))
        said = capsys.readouterr().out + "".join(f"warning: {w.message}\n" for w in warned)
        promise_of(command)(run_dir, said)
    finally:
        seed_hooks.STORAGE.clear()


def test_ci_runs_exactly_the_readmes_test_commands():
    """``.ci/run`` runs the README's test commands and nothing cleverer: the pytest, mkdocs and scripts/ lines
    of the README's "Tests" block are those of ``.ci/run``, in the same order."""
    (tests,) = blocks(section("README.md", "Tests"), "bash")
    command = r"(?:[A-Z_]+=\S+ )*(?:python -m pytest|mkdocs build|scripts/\S+\.sh)[^#&]*"  # with the environment it sets
    readme = [re.search(command, line).group(0).strip() for line in tests.splitlines()
              if re.search(r"python -m pytest|mkdocs build|^scripts/", line)]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if re.fullmatch(command, line.strip())]
    assert readme == ci
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = {m.split(":")[0] for m in options["markers"]}
    chosen = [re.findall(r' -m ("[^"]*"|\w+)', line)[-1].strip('"') for line in ci if re.search(r" -m (?!pytest)", line)]
    assert {expression.split()[0] for expression in chosen} == markers, "every marked group runs in CI"
    groups = re.findall(r"not (\w+)", options["addopts"])  # what the default run leaves out
    assert f"statistics and not ({' or '.join(groups)})" in chosen, "the statistics tests again: the default run's only"


def test_the_output_schema_names_every_column_of_units_parquet():
    from common.records import UNITS_SCHEMA

    schema = section("reference/output-schema.md", "Output schema")
    paragraph = schema.split("`units.parquet` exists only", 1)[1].split("\n\n", 1)[0]
    assert [name for name in UNITS_SCHEMA.names if f"`{name}`" not in paragraph] == ["hook", "layer", "call", "unit"]
