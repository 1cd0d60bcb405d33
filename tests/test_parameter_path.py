"""The README's "How it is built" traces one parameter (a clamp's ``min``) from its preset to
``torch.clamp``: this runs that command line in this process and checks the path it states —
each function is called, in that order, in the file it names, with the parameter's value; the
hop and file counts are the stated ones, within the issue's limits (10 hops, 6 files), and the
path never goes back to a file it left."""
from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from hooks.types.gradients import Clamp
from runner.cli.commandline import check_command_line
from runner.cli.execute import execute
from runner.config.compose import compose_config
from docs_text import page
from project_code import project_file

ROOT = Path(__file__).resolve().parents[1]
ARGV = ["hooks=clip", "hooks.clip.min=-0.01", "model=custom", "model._target_=torch.nn.Linear",
        "+model.in_features=3", "+model.out_features=3", "model.input_shape=[2,3]", "steps=1", "progress=false"]


def stated_path() -> tuple[int, int, list[tuple[str, str | None]], str]:
    """The README's hop and file counts, its stops as (file, function) before the final call (one hop
    each: the arrow after it), and the final call's code."""
    text = " ".join(page("explanation/architecture.md").split())
    found = re.search(r"One parameter's way, .*? in (\d+) hops through (\d+) files and never back: (.*?`partial\(torch\.clamp[^`]*\)`)",
                      text)
    assert found, "'How it is built' (docs/explanation/architecture.md) no longer traces one parameter"
    hops, files, chain = int(found[1]), int(found[2]), found[3]
    stops, file = [], None
    for segment in chain.split("→")[:-1]:
        names = re.findall(r"`([^`]+)`", segment)
        if names and names[0].endswith((".py", ".yaml")):
            file = names.pop(0)
        stops.append((file, names[0] if names else None))
    return hops, files, stops, re.findall(r"`([^`]+)`", chain.split("→")[-1])[0]


def test_the_readme_traces_a_clamps_min_along_the_calls_a_run_makes(tmp_path):
    hops, n_files, stops, final = stated_path()
    assert hops == len(stops) and hops <= 10
    files = [file for file, _ in stops]
    assert n_files == len(set(files)) and n_files <= 6
    left = [file for i, file in enumerate(files) if i and file != files[i - 1]]
    assert len(left) == len(set(left)) and files[0] not in left, f"the path goes back to a file it left: {files}"
    assert (ROOT / files[0]).is_file() and stops[0][1] is None
    functions = [(file, name) for file, name in stops[1:]]
    first_call: dict[tuple[str, str], int] = {}
    values: dict[tuple[str, str], float] = {}
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event != "call":
            return
        calls += 1
        where = (project_file(frame.f_code.co_filename) or "", frame.f_code.co_qualname)
        if where in functions and where not in first_call:
            first_call[where] = calls
            spec = frame.f_locals.get("self")
            values[where] = getattr(getattr(spec, "spec", spec), "min", None)

    sys.setprofile(profile)
    try:  # what ``python -m runner ARGV`` does, in this process
        checked = check_command_line(ARGV)
        cfg = compose_config(ARGV)
        execute(cfg, tmp_path / "run", ARGV, plan=checked.plan_for(0, ARGV))
    finally:
        sys.setprofile(None)
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert [f for f in functions if f not in first_call] == [], "a stop of the README's path is not called"
    order = sorted(functions, key=first_call.get)
    assert order == functions, f"called in another order: {order}"
    assert values[functions[-2]] == values[functions[-1]] == -0.01, "the clamp's spec holds the parameter"
    assert final in inspect.getsource(Clamp.transform.fget)
