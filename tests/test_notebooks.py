"""The notebook tutorials (docs/notebooks/*.py, jupytext percent format) run in a real Jupyter kernel and
say what plain PyTorch says; ``runner.attach`` behaves in a notebook: a re-run cell refuses in one line or
writes a second complete run, an interrupted cell leaves no hooks and no complete run, and the next cell runs.

The kernel is ipykernel's own ``python3`` spec (installed with ipykernel, the ``test`` extra); it inherits
this process's environment, with the checkout under test first on ``PYTHONPATH`` (whatever checkout
``pip install -e`` pointed at).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

pytestmark = pytest.mark.docs_runs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "docs" / "notebooks"
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def kernels_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def executed(name: str, tmp_path: Path, *extra_cells: str):
    """The notebook ``name`` with ``extra_cells`` appended, executed in a fresh ``python3`` kernel in ``tmp_path``."""
    import jupytext  # Jupyter's packages are imported by the tests that run a kernel: not when the default
    from nbclient import NotebookClient  # suite, whose every xdist worker collects this file, leaves them out
    from nbformat.v4 import new_code_cell

    notebook = jupytext.read(NOTEBOOKS / name)
    notebook.cells.extend(new_code_cell(source) for source in extra_cells)
    NotebookClient(notebook, kernel_name="python3", timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook


def cell_with(notebook, source: str):
    """The code cell whose source holds ``source``."""
    return next(cell for cell in notebook.cells if cell.cell_type == "code" and source in cell.source)


def stdout_of(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def has_picture(cell) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.outputs)


def digits_mlp() -> nn.Module:
    """The notebook's ``fresh_model()``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def clipped(model: nn.Module, bound: float) -> nn.Module:
    """``model`` with every parameter's gradient clamped to [-bound, bound], as ``clip`` does, by hand."""
    for param in model.parameters():
        param.register_hook(lambda grad: grad.clamp(-bound, bound))
    return model


def sgd_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor, starts: list[int]) -> list[float]:
    """The loss of each SGD step (lr 0.5) on the 64 rows from each of ``starts``, as the notebook trains."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for start in starts:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[start:start + 64]), y[start:start + 64])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_clip_notebook_matches_plain_pytorch(tmp_path):
    digits = load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float32) / 16, torch.tensor(digits.target)
    notebook = executed("clip.py", tmp_path, "print(kept.to_json()); print(curves.to_json())")
    kept_json, curves_json = stdout_of(notebook.cells[-1]).splitlines()
    kept, curves = json.loads(kept_json), json.loads(curves_json)

    norms = {}
    for bound in (1000.0, 0.01, 0.0001):
        model = clipped(digits_mlp(), bound)
        F.cross_entropy(model(x[:256]), y[:256]).backward()
        norms[bound] = {layer: torch.stack([p.grad.norm() for p in model[int(layer)].parameters()]).norm().item()
                        for layer in ("0", "2")}
    for bound in (0.01, 0.0001):
        for layer in ("0", "2"):
            assert kept[str(bound)][layer] == pytest.approx(norms[bound][layer] / norms[1000.0][layer], rel=1e-4)
    assert kept["0.01"]["0"] < 0.9 and kept["0.0001"]["0"] < 0.05  # the bounds reach the layers
    assert "hooks.clip.max" in stdout_of(cell_with(notebook, "print(kept.round(3))"))  # the printed table is that table

    for name, bound in (("none", None), ("clip", 0.01)):
        model = digits_mlp() if bound is None else clipped(digits_mlp(), bound)
        losses = sgd_losses(model, x, y, [s % 1792 for s in range(0, 64 * 30, 64)])
        assert [curves[name][str(step)] for step in range(30)] == pytest.approx(losses, abs=1e-4), name
    assert curves["clip"]["29"] > curves["none"]["29"] + 0.3  # the clipped run learns slower, as the page says
    assert has_picture(cell_with(notebook, "plt.subplots"))


def test_units_notebook_matches_plain_pytorch(tmp_path):
    digits = load_digits()
    notebook = executed("units.py", tmp_path,
                        'print(top[["layer", "unit", "max", "dead_fraction", "input", "class", "value"]]'
                        '.to_json(orient="records"))')
    rows = json.loads(stdout_of(notebook.cells[-1]))

    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    with torch.no_grad():
        first = model[0](images)
        outputs = {"0": first, "2": model[2](model[1](first))}
    expected = []
    for layer, out in outputs.items():
        per_sample = out.amax(dim=(2, 3))                           # a sample's value: its max over positions
        dead = (out <= 0.0).float().mean(dim=(0, 2, 3))             # of every value, at or below the threshold
        for unit in per_sample.amax(0).topk(3).indices.tolist():
            values, samples = per_sample[:, unit].topk(4)
            expected += [(layer, unit, values[0].item(), dead[unit].item(), f"digits[{sample}]", value,
                          str(digits.target[sample]))
                         for sample, value in zip(samples.tolist(), values.tolist())]
    assert len(rows) == len(expected) == 24
    for row, (layer, unit, peak, dead_fraction, name, value, digit) in zip(rows, expected):
        assert (row["layer"], row["unit"], row["input"], row["class"]) == (layer, unit, name, digit)
        assert row["max"] == pytest.approx(peak, rel=1e-5)
        assert row["value"] == pytest.approx(value, rel=1e-5)
        assert row["dead_fraction"] == pytest.approx(dead_fraction, abs=1e-6)
    assert "digits[" in stdout_of(cell_with(notebook, "print(top[")) and has_picture(cell_with(notebook, "plt.subplots"))


SETUP = f"""
import os, sys, time
import torch, torch.nn.functional as F
sys.path.insert(0, {str(TESTS)!r})
from conftest import hook_changes, hook_snapshot
import runner, runner.analysis
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
before = hook_snapshot(model)
"""

TRAIN = """
with runner.attach(model, hooks=["stats"], out_dir={out!r}{extra}) as run:
    print("training", flush=True)
    for i in range({steps}):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        run.step(loss)
        time.sleep({pause})
"""


def train(out: str, steps: int = 3, pause: float = 0.0, extra: str = "") -> str:
    return TRAIN.format(out=out, steps=steps, pause=pause, extra=extra)


class Kernel:
    """One live ``python3`` kernel, run as a notebook's cells run: ``cell(code)`` returns its reply and stdout."""

    def __init__(self, cwd: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3", cwd=str(cwd))

    def cell(self, code: str) -> tuple[dict, str]:
        out: list[str] = []
        reply = self.client.execute_interactive(code, timeout=60, output_hook=lambda msg: out.append(
            msg["content"]["text"] if msg["msg_type"] == "stream" else ""))
        return reply["content"], "".join(out)

    def ok(self, code: str) -> str:
        reply, out = self.cell(code)
        assert reply["status"] == "ok", (reply.get("ename"), reply.get("evalue"))
        return out

    def interrupted(self, code: str, once: str, after: float) -> dict:
        """Run ``code``, interrupt the kernel ``after`` seconds after it printed ``once``; the cell's reply.
        ``stop_on_error=False``: else ipykernel aborts the cells sent in the moments after the interrupt
        (seen under load: the next cell came back ``aborted``), which is Jupyter's doing, not ours."""
        msg_id = self.client.execute(code, stop_on_error=False)
        while True:
            msg = self.client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id and once in msg["content"].get("text", ""):
                break
        time.sleep(after)
        self.manager.interrupt_kernel()
        while True:
            reply = self.client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path):
    live = Kernel(tmp_path)
    live.ok(SETUP)
    yield live
    live.close()


def test_attach_in_a_notebook_rerun_and_interrupted_cells(kernel, tmp_path):
    kernel.ok(train("runs/cell"))
    assert kernel.ok("print(hook_changes(before, hook_snapshot(model)))").strip() == "[]"

    reply, _ = kernel.cell(train("runs/cell"))          # the same cell again: refused in one line, nothing attached
    assert (reply["status"], reply["ename"]) == ("error", "ConfigError")
    assert "\n" not in reply["evalue"] and "overwrite=True" in reply["evalue"]
    assert kernel.ok("print(hook_changes(before, hook_snapshot(model)))").strip() == "[]"

    kernel.ok(train("runs/cell", steps=2, extra=", overwrite=True"))   # as the refusal says: a second complete run
    assert kernel.ok("print(runner.analysis.load_steps('runs/cell').step.tolist())").strip() == "[0, 1]"

    # interrupted while sleeping in the user's loop, then while the runner's code runs (no sleep: most of a step)
    for out, pause, after in (("runs/stopped", 0.02, 0.5), ("runs/stopped_busy", 0.0, 0.2)):
        reply = kernel.interrupted(train(out, steps=100_000, pause=pause), once="training", after=after)
        assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
        assert kernel.ok("print(hook_changes(before, hook_snapshot(model)))").strip() == "[]"
        assert not (tmp_path / out / "manifest.json").exists()
    assert kernel.ok("print(sorted(set(runner.analysis.load_steps('runs').run_dir)))").strip() == "['runs/cell']"

    kernel.ok(train("runs/stopped"))                    # the interrupted cell, run again, completes its run
    assert (tmp_path / "runs" / "stopped" / "manifest.json").exists()
    assert kernel.ok("print(hook_changes(before, hook_snapshot(model)))").strip() == "[]"
    steps = kernel.ok("print(runner.analysis.load_steps('runs').groupby('run_dir').step.max().to_dict())")
    assert steps.strip() == "{'runs/cell': 1, 'runs/stopped': 2}"
