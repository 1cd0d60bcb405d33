"""Fuzzing the command line: whatever hypothesis draws from the schema's keys, the presets, the selectors and
their values (valid or not), ``python -m runner ARGS`` (its in-process entry, ``runner.__main__.main``)
either commits a complete run (status 0, ``manifest.json``) or prints one line ``error: ...`` with status
2, never a traceback, and leaves no directory behind.

The default budget is small (a handful of command lines, about ten seconds on a busy machine):
``HYPOTHESIS_MAX_EXAMPLES`` raises it for a longer hunt.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import runner.__main__ as runner_main
from conftest import hook_snapshot

CONF = Path(__file__).resolve().parents[1] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "hooks").glob("*.yaml"))
#: Models built without files or downloads, and names that are not models.
MODELS = ["mlp", "convnet", "linear", "resnet19", "mlpp"]
SELECTORS = ["'**'", "'*'", "leaf:**", "type:Linear", "type:ReLU", "re:fc.*", "fc", "fc1", "nope", "type:Nope",
             "'[fc1,fc2]'", "''"]
#: Values of the run's own keys: valid, ill-typed, out of range, misspelt.
RUN_VALUES = {
    "steps": ["1", "2", "0", "-1", "abc", "null"],
    "mode": ["train", "eval", "trian"],
    "seed": ["0", "7", "x"],
    "loss": ["sum", "mean", "none", "cross_entropy", "summ"],
    "on_silent": ["warn", "ignore", "error", "loud"],
    "on_nonfinite": ["warn", "ignore", "nope"],
    "sample.every": ["1", "2", "0"],
    "optimizer": ["none", "sgd", "adam", "sgdd"],
    "data": ["randn", "ones", "nope"],
}
STRAYS = ["step=2", "+typo=1", "+model.widht=3", "hooks=", "moddel=mlp", "~steps", "=1", "model=1", "hooks=[clip,1]"]
HOOK_KEYS = {"min": ["-0.1", "0.1", "nan", "abc"], "max": ["0.1", "-1", "null"], "factor": ["2", "0", "x"],
             "kinds": ["[output]", "[grad_output]", "[bogus]"], "maxx": ["1"], "target": ["output", "params", "x"]}


@st.composite
def command_lines(draw) -> list[str]:
    argv = [f"model={draw(st.sampled_from(MODELS))}"]
    presets = draw(st.lists(st.sampled_from(PRESETS + ["clp"]), max_size=2, unique=True))
    if presets:
        argv.append(f"hooks={presets[0]}" if len(presets) == 1 else f"hooks=[{','.join(presets)}]")
    for preset in presets:
        if draw(st.booleans()):
            argv.append(f"hooks.{preset}.layers={draw(st.sampled_from(SELECTORS))}")
        for key in draw(st.lists(st.sampled_from(sorted(HOOK_KEYS)), max_size=2, unique=True)):
            argv.append(f"hooks.{preset}.{key}={draw(st.sampled_from(HOOK_KEYS[key]))}")
    for key in draw(st.lists(st.sampled_from(sorted(RUN_VALUES)), max_size=3, unique=True)):
        argv.append(f"{key}={draw(st.sampled_from(RUN_VALUES[key]))}")
    if draw(st.integers(0, 4)) == 0:
        argv.append(draw(st.sampled_from(STRAYS)))
    if not any(a.startswith("steps=") for a in argv):
        argv.append("steps=1")
    return argv


def run_main(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["runner", *argv])
    try:
        runner_main.main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@settings(max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", 3)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=command_lines())
@example(argv=["model=linear", "=1", "steps=1"])  # Hydra's compose raised a bare ValueError: 35 lines
def test_a_command_line_is_a_complete_run_or_one_line_with_status_2(argv, tmp_path_factory, monkeypatch, capsys):
    out = tmp_path_factory.mktemp("fuzz") / "run"
    before = hook_snapshot()
    code, err = run_main([*argv, "progress=false", "quiet=true", f"hydra.run.dir={out}"], monkeypatch, capsys)
    assert "Traceback" not in err, (argv, err)
    assert hook_snapshot() == before, argv
    if code == 0:
        assert (out / "manifest.json").is_file(), (argv, err)
    else:
        errors = [line for line in err.splitlines() if not line.startswith("warning: ")]
        assert code == 2, (argv, code, err)
        assert len(errors) == 1 and errors[0].startswith("error: "), (argv, err)
        assert not out.exists(), (argv, sorted(p.name for p in out.iterdir()))
