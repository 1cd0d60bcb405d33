"""docs/tutorials/families.md: its commands run as written (the script building the models, the one sweep over
three families, the report) and its Python block on what they made; every norm of its table and of its picture
equals plain PyTorch forward hooks on each family's own modules (float64), the lens at the last block each
model's own logits, and the report's picture is the page's."""
from __future__ import annotations

import base64
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_config
from docs_text import blocks, page
from runner.engine.plan import compile_plan

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
PAGE = page("tutorials/families.md")
ASSET = ROOT / "assets" / "families_sweep.png"
#: Mean absolute difference per pixel channel (of 255) that font and anti-aliasing changes between matplotlib
#: releases stay under (as tests/test_readme_steering.py's); the page's own sweep drew 0.0.
PIXEL_TOLERANCE = 1.0
#: Each family's blocks by its own name, apart from the vocabulary.
OWN_BLOCKS = {"gpt2": "transformer.h", "llama": "model.layers", "qwen3": "model.layers"}


def run_as_written(command: str, monkeypatch) -> None:
    """``python scripts/X.py ARGS`` or ``python -m MODULE ARGS`` in this process, as Python runs them."""
    words = shlex.split(command)
    assert words[0] == "python", command
    module = words[2] if words[1] == "-m" else None
    argv = words[3:] if module else words[2:]
    monkeypatch.setattr(sys, "argv", [module or words[1], *argv, *(["progress=false"] if module == "runner" else [])])
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(ROOT / words[1]), run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (0, None), command


def plain(folder: Path, x: torch.Tensor, family: str) -> tuple[list[float], torch.Tensor]:
    """The saved model in float64 on ``x``: each block's output l2 (forward hooks on its own modules), its logits."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval().double()
    norms = {}
    def keep(i: int, out: torch.Tensor) -> None:  # returns None: the output stays as it is
        norms[i] = float(out.norm())

    handles = [block.register_forward_hook(lambda m, a, out, i=i: keep(i, out))
               for i, block in enumerate(model.get_submodule(OWN_BLOCKS[family]))]
    with torch.no_grad():
        logits = model(x).logits
    for handle in handles:
        handle.remove()
    return [norms[i] for i in sorted(norms)], logits


@pytest.mark.docs_runs  # three models built, a sweep of three jobs and a report: about a minute on 2 busy cores
def test_the_three_family_sweep_runs_as_written_and_its_table_and_picture_are_plain_hooks_numbers(tmp_path, monkeypatch):
    from runner.analysis.plots import compare_runs

    monkeypatch.chdir(tmp_path)
    commands = [line for block in blocks(PAGE, "bash") for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert [c.split()[:3] for c in commands] == [["python", "scripts/make_family_models.py", "models"],
                                                 ["python", "-m", "runner"], ["python", "-m", "runner.report"]]
    for command in commands:
        run_as_written(command, monkeypatch)
    scope: dict = {}
    exec(compile(blocks(PAGE, "python")[0], "docs/tutorials/families.md", "exec"), scope)
    norms, last, stats = scope["norms"], scope["last"], scope["stats"]

    sweep = shlex.split(commands[1])
    job = [w for w in sweep[4:] if not w.startswith(("model.path=", "hydra."))]
    x = next(compile_plan(make_config(*job, "model.path=models/gpt2")).data.batches(0, torch.device("cpu"))).x
    figure = compare_runs(stats, stat="l2", kind="output")
    (ax,) = figure.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"blocks.{b}.resid_post" for b in range(4)]
    lines = {line.get_label().removeprefix("model.path=models/"): line.get_ydata() for line in ax.get_lines()}
    assert sorted(lines) == sorted(OWN_BLOCKS)
    for family in OWN_BLOCKS:
        want, logits = plain(tmp_path / "models" / family, x, family)
        got = norms[f"models/{family}"].to_numpy()
        assert got == pytest.approx(want, rel=1e-5), family
        assert np.asarray(lines[family]) == pytest.approx(want, rel=1e-5), family
        rows = last[last["model.path"] == f"models/{family}"].sort_values(["sample", "position"])
        top = torch.tensor(np.stack(rows.top_logits.to_numpy()), dtype=torch.float64)
        k = top.shape[-1]
        torch.testing.assert_close(top, logits.sort(-1, descending=True).values[..., :k].reshape(top.shape),
                                   rtol=0, atol=1e-5)
    assert sorted(stats.groupby("canonical").layer.unique()["blocks.3.resid_post"]) == ["model.layers.3", "transformer.h.3"]

    report = (tmp_path / "runs" / "families" / "report.html").read_text()
    (png,) = re.findall(r'<img alt="output l2 per run" src="data:image/png;base64,([^"]+)"', report)
    drawn = np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"), dtype=float)
    shown = np.asarray(Image.open(ASSET).convert("RGB"), dtype=float)  # the picture the page shows
    assert drawn.shape == shown.shape and np.abs(drawn - shown).mean() < PIXEL_TOLERANCE, np.abs(drawn - shown).mean()
