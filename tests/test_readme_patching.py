"""The docs' "Activation patching" and "Attribution and path patching" (docs/tutorials/patching.md): every command as written,
in one directory in the README's order (each that names a fixed directory run a second time: refused
with one line, the directory as it was), then the sections' Python blocks on what they made.

The numbers are checked against plain PyTorch: every patching cell against a hand-written patching
loop, the attribution estimates against a hand-written gradient x difference, the path cells against
a hand-written two-pass loop; the correlation and the recovered fractions the README states are the
ones the commands give. Slow (the sweeps are 64, 64 and 48 jobs): marker ``slow``."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from docs_text import blocks, page, section
from runner.sources.models import gpt2_tiny
from test_attribution import hand_attribution, stored_estimates
from test_interventions import hand_patched_logits, logit_diff, tokens
from test_path_patching import hand_path_patched

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGE = page("tutorials/patching.md")
FIXED = re.compile(r"\bhydra\.(?:run|sweep)\.dir=(\S+)")
N_LAYER = 4


def section_blocks(title: str) -> tuple[list[list[str]], list[str]]:
    """A section's shell blocks (each a list of commands, continuations joined) and Python blocks."""
    text = section("tutorials/patching.md", title)
    bash = [block.replace("\\\n", " ") for block in blocks(text, "bash")]
    python = blocks(text, "python")
    return [[line for line in block.splitlines() if line.strip()] for block in bash], python


def snapshot(where: Path) -> list:
    return sorted((p.relative_to(where), p.stat().st_mtime_ns) for p in where.rglob("*"))


def run_as_written(commands: list[str], cwd: Path) -> None:
    """Each command as the README writes it (``progress=false`` added to the runner's); one naming a fixed
    directory runs twice, and the second is refused with one line naming it, leaving it as it was."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in commands:
        words = shlex.split(command, comments=True)
        quiet = ["progress=false"] if words[2] == "runner" else []
        done = subprocess.run([sys.executable, *words[1:], *quiet], cwd=cwd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        fixed = FIXED.search(command)
        if fixed is None:
            continue
        before = snapshot(cwd / fixed.group(1))
        again = subprocess.run([sys.executable, *words[1:], *quiet], cwd=cwd, env=env, capture_output=True, text=True)
        lines = again.stderr.strip().splitlines()
        assert again.returncode == 2 and len(lines) == 1, again.stderr[-2000:]
        assert lines[0].startswith(f"error: overwrite: '{fixed.group(1)}' already holds a "), lines[0]
        assert snapshot(cwd / fixed.group(1)) == before


def run_python(block: str, cwd: Path, name: str, monkeypatch) -> dict:
    monkeypatch.chdir(cwd)
    scope: dict = {}
    exec(compile(block, f"docs/tutorials/patching.md ({name})", "exec"), scope)
    return scope


def patching_section(cwd: Path) -> tuple[list[list[str]], list[str]]:
    """Run both ways of the patching section in ``cwd``; its Python blocks."""
    bash, python = section_blocks("Activation patching")
    assert len(bash) == 2 and len(python) == 2 and len(bash[0]) == 4 and "hooks.patch.source=clean" in bash[1][0]
    for commands in bash:
        run_as_written(commands, cwd)
    return bash, python


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("readme_patching")
    patching_section(cwd)
    return cwd


def report_section(run_dir: Path) -> str:
    page = (run_dir / "report.html").read_text()
    return page.split('<section id="patching">', 1)[1].split("</section>", 1)[0]


def test_the_patching_sweep_s_heatmap_numbers_are_the_hand_computed_ones(patched, monkeypatch):
    _, (python, own_python) = section_blocks("Activation patching")
    table = run_python(python, patched, "Activation patching", monkeypatch)["table"]
    assert (patched / "runs" / "patching.png").read_bytes().startswith(b"\x89PNG")
    assert len(table) == N_LAYER * 16 and set(table.method) == {"patch"}
    for row in table.itertuples():
        clean, corrupted, patched_logits = hand_patched_logits(int(row.layer.rsplit(".", 1)[1]), int(row.index),
                                                               n_layer=N_LAYER)
        by_hand = (logit_diff(patched_logits) - logit_diff(corrupted)) / (logit_diff(clean) - logit_diff(corrupted))
        assert row.recovered == pytest.approx(by_hand, rel=1e-4, abs=1e-6), row
    last = table[table.layer == f"transformer.h.{N_LAYER - 1}"].set_index("index").recovered
    assert last[15] == 1.0 and (last.drop(15) == 0.0).all()  # what the README says of the last block
    for sweep in ("patching", "patching_clean"):
        section = report_section(patched / "runs" / sweep)
        assert 'alt="recovered fraction per layer and index"' in section and "transformer.h.3" in section
    # the second way: each job's own clean and corrupted passes, the same table cell for cell
    own = run_python(own_python, patched, "Activation patching, source=clean", monkeypatch)["table"]
    columns = ["patched", "clean", "corrupted", "recovered"]
    assert own.set_index(["layer", "index"]).sort_index()[columns].equals(
        table.set_index(["layer", "index"]).sort_index()[columns])


def test_attribution_and_path_tables_are_the_hand_computed_ones_and_what_the_readme_states(patched, monkeypatch):
    (attribution, path), (python,) = section_blocks("Attribution and path patching")
    assert len(attribution) == 2 and "hooks=attribution" in attribution[0] and "hooks.patch.receiver" in path[0]
    run_as_written([*attribution, *path], patched)
    scope = run_python(python, patched, "Attribution and path patching", monkeypatch)
    table, both, r = scope["table"], scope["both"], scope["r"]
    assert table.groupby("method").size().to_dict() == {"patch": 64, "attribution": 64, "path": 48}
    assert (patched / "runs" / "methods.png").read_bytes().startswith(b"\x89PNG")
    stated = re.search(r"correlates with real patching at\s+r = (\d\.\d\d)", PAGE).group(1)
    assert len(both) == 64 and f"{r:.2f}" == stated
    # the estimates are the hand-written gradient x difference on the README's 4-block model
    torch.manual_seed(0)
    layers = [f"transformer.h.{b}" for b in range(N_LAYER)]
    by_hand = hand_attribution(gpt2_tiny(n_layer=N_LAYER).eval(), layers, tokens(0), tokens(1),
                               lambda output: (output.logits[:, -1, 3] - output.logits[:, -1, 4]).mean())
    estimates = stored_estimates(patched / "runs" / "attribution")
    assert set(estimates) == set(layers)
    for name in layers:
        torch.testing.assert_close(estimates[name], by_hand[name])
    assert "<td>attribution</td>" in report_section(patched / "runs" / "attribution")
    # each path cell at the last position is the hand-written two-pass loop's; block 0 to block 1 is the whole patch
    paths = table[table.method == "path"].set_index(["receiver", "index"])
    for receiver in range(1, N_LAYER):
        patched_logits, _ = hand_path_patched(0, receiver, 15, n_layer=N_LAYER)
        assert paths.loc[(f"transformer.h.{receiver}", 15), "patched"] == pytest.approx(logit_diff(patched_logits),
                                                                                          abs=1e-6)
    whole = table[(table.method == "patch") & (table.layer == "transformer.h.0")].set_index("index").recovered
    assert paths.loc["transformer.h.1"].recovered.to_numpy() == pytest.approx(whole.to_numpy(), abs=1e-5)
    said = re.search(r"what block 0\s+sends block 2 directly recovers (\d\.\d\d), what it sends block 3 directly "
                     r"(\d\.\d\d)", PAGE).groups()
    assert tuple(f"{paths.loc[(f'transformer.h.{b}', 15), 'recovered']:.2f}" for b in (2, 3)) == said
