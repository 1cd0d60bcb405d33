"""Every command of README.md and the docs pages that names a fixed output directory, run twice in a row.

Without ``hydra.run.dir`` or ``hydra.sweep.dir`` a second run writes beside the first; a command
that names its directory (the docs' patching, training and clip examples, the replay, the
examples of "Configuration", ``runner.attach``'s ``out_dir``) is refused the second time with the
one line the docs show for it, status 2, the directory as it was. The commands run in-process
(``runner.__main__.main``, Hydra and its callbacks included) in a fresh directory; the first run
of a big sweep is made smaller (fewer steps or jobs, as ``SMALLER`` says) and the second runs as
written: what refuses it is that its directory holds complete runs, whatever their size.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import ConfigError
import runner.analysis as analysis
from docs_text import blocks, everything, section

pytestmark = pytest.mark.docs_runs

ROOT = Path(__file__).resolve().parents[1]
TEXT = everything()  # README.md and the docs pages
#: What the first run changes in the big commands: 2 training steps, 4 patching jobs, 1 clip bound, one shard
#: on the local launcher, one steering scale, 32x32 crops (the second run, as written, is refused before anything is launched).
SMALLER = {"steps=300": "steps=2", "eval_every=25": "eval_every=1",
           "range(0,16)": "range(15,16)", "data.shard=range(0,4)": "data.shard=range(3,4)",
           "hydra/launcher=slurm_cpu hydra.launcher.partition=debug ": "",  # the first run here; Slurm's in -m slurm
           "transformer.h.0,transformer.h.1,transformer.h.2,transformer.h.3": "transformer.h.0",
           ",{min:-0.01,max:0.01},{min:-0.0001,max:0.0001}": "", "data.path=assets/": f"data.path={ROOT}/assets/",
           "hooks.steer.scale=0,16,32": "hooks.steer.scale=16", "data.resize=64 data.crop=64": "data.resize=32 data.crop=32"}
FIXED = re.compile(r"\b(hydra\.run\.dir|hydra\.sweep\.dir|replay\.out)=(\S+)")


def fixed_dir_commands() -> list[str]:
    """Every ``python -m runner`` command of the code blocks of README.md and the docs that names a fixed directory."""
    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", TEXT, re.S | re.M):
        if language not in ("", "bash"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").split("#", 1)[0].strip()
            if line.startswith("python -m runner ") and FIXED.search(line) and line not in commands:
                commands.append(line)
    return commands


COMMANDS = fixed_dir_commands()
#: The one lines the README shows for a second run, as patterns (any directory, any job counts).
DOCUMENTED = [re.escape(line).replace(r"'runs/linear'", "'(?P<dir>[^']+)'").replace("'runs/bounds'", "'(?P<dir>[^']+)'")
              .replace(r"\(2\ of\ 2\ ", r"\(\d+\ of\ \d+\ ").replace("2 of 2 ", r"\d+ of \d+ ")
              for line in re.findall(r"^(error: overwrite: .*)$", TEXT, re.M)]


def run_cli(command: str, monkeypatch, capsys) -> tuple[int, str]:
    words = shlex.split(command)
    monkeypatch.setattr(sys, "argv", ["runner", *words[3:]])
    from runner.__main__ import main

    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_the_readme_documents_the_refusals_and_names_fixed_directories():
    assert len(DOCUMENTED) == 2
    assert len(COMMANDS) >= 8, COMMANDS
    assert {FIXED.search(c).group(1) for c in COMMANDS} == {"hydra.run.dir", "hydra.sweep.dir", "replay.out"}


@pytest.mark.parametrize("command", COMMANDS, ids=[FIXED.search(c).group(2) for c in COMMANDS])
def test_a_readme_command_run_twice_is_refused_with_the_documented_line(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if "data.path=outputs/crops" in command:  # the README makes the folder first (python assets/make_crops.py outputs/crops)
        subprocess.run([sys.executable, str(ROOT / "assets" / "make_crops.py"), "outputs/crops"], cwd=tmp_path, check=True)
    if "model.path=models/" in command:  # the tutorial makes the folders first (python scripts/make_family_models.py models)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_family_models.py"), "models"], cwd=tmp_path, check=True)
    if "=tests/fixtures/" in command:  # a folder the repository holds (the SAE of "Sparse autoencoder features")
        shutil.copytree(ROOT / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    for earlier in COMMANDS[:COMMANDS.index(command)]:  # what a command reads (the replayed run, the clean run)
        if re.search(rf"[=\s]{re.escape(FIXED.search(earlier).group(2))}(\s|$)", command):
            first = earlier
            for big, small in SMALLER.items():
                first = first.replace(big, small)
            assert run_cli(first, monkeypatch, capsys)[0] == 0
    first = command
    for big, small in SMALLER.items():
        first = first.replace(big, small)
    code, err = run_cli(first, monkeypatch, capsys)
    assert code == 0, err
    where = tmp_path / FIXED.search(command).group(2)
    before = sorted((p.relative_to(where), p.stat().st_mtime_ns) for p in where.rglob("*"))
    code, err = run_cli(command.replace("data.path=assets/", f"data.path={ROOT}/assets/"), monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    if FIXED.search(command).group(1) == "replay.out":
        assert lines[0] == (f"error: replay.out: '{FIXED.search(command).group(2)}' already holds a complete run, "
                            "which a replay never replaces; choose another replay.out")
    else:
        assert any(re.fullmatch(pattern, lines[0]) for pattern in DOCUMENTED), lines[0]
        assert f"'{FIXED.search(command).group(2)}'" in lines[0]
    assert sorted((p.relative_to(where), p.stat().st_mtime_ns) for p in where.rglob("*")) == before


def test_a_readme_example_of_configuration_run_twice_gives_its_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    section = TEXT.split("Every command runs twice.", 1)[1].split("```", 2)[1]
    lines = section.strip().splitlines()
    for command, shown in zip(lines[0::2], lines[1::2]):
        command = command.removeprefix("$ ").split("#", 1)[0]
        assert run_cli(command, monkeypatch, capsys)[0] == 0
        assert run_cli(command, monkeypatch, capsys) == (2, shown + "\n")


def test_runner_attach_run_twice_is_refused_in_python_terms(tmp_path, monkeypatch):
    """The own-loop example ("Your own loop", docs/how-to/own-model.md) as written, twice: the first writes a
    run the loaders read (the ``runner.attach`` snippet runs as it stands), the second raises the documented
    one line."""
    code = blocks(section("how-to/own-model.md", "Your own loop"), "python")[0]
    shown = TEXT.split("a second time raises `ConfigError`", 1)[1].split("```\n", 2)[1].strip()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/how-to/own-model.md (Your own loop)", "exec"), {})
    steps = analysis.load_steps(tmp_path / "runs" / "mine")
    assert len(steps) == 2 * 29 and steps.accuracy.between(0, 1).all()  # 1,797 digits in batches of 64, 2 epochs
    stats = analysis.load_stats(tmp_path / "runs" / "mine")
    assert (stats[stats.kind == "param_grad"]["max"] <= 0.1 * (1 + 1e-7)).all()
    with pytest.raises(ConfigError) as raised:
        exec(compile(code, "docs/how-to/own-model.md (Your own loop)", "exec"), {})
    assert f"error: {raised.value}" == shown
    assert analysis.load_stats(tmp_path / "runs" / "mine").equals(stats)


def test_an_uncaught_attach_mistake_prints_one_line(tmp_path):
    import subprocess

    script = ("import torch, runner\nm = torch.nn.Linear(3, 2)\n"
              "for _ in range(2):\n"
              "    with runner.attach(m, hooks=['clip'], out_dir='run') as run:\n"
              "        loss = m(torch.ones(1, 3)).sum(); run.backward(loss); run.step(loss)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert done.stderr == ("error: out_dir: 'run' already holds a complete run; pass overwrite=True to replace it, "
                           "or another out_dir\n")


def test_the_readme_s_first_error_example_is_what_the_command_line_prints(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    example = r"^\$ (python -m runner hooks=clip hooks.clip.type=clmap)\n(error: .*)$"
    command, shown = re.search(example, TEXT, re.M).groups()
    assert run_cli(command, monkeypatch, capsys) == (2, shown + "\n")


def test_the_readme_lists_every_hook_preset():
    row = next(line for line in TEXT.splitlines() if line.startswith("| `hooks` |"))
    presets = {p.stem for p in (ROOT / "conf" / "hooks").glob("*.yaml")}
    assert presets == set(re.findall(r"`(\w+)`", row.split("|")[2])) - {"layer4"}
