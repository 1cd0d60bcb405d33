"""The answer of generation runs: a run prints each prompt's generated text, a sweep each prompt's text under
every swept value, both as ``generations.parquet`` holds them; the how-to page's command runs as written."""
from __future__ import annotations

import shlex

import pandas as pd

from conftest import make_config, run, run_main
from docs_text import ROOT, blocks, section
from runner.analysis.load import load_table
from runner.analysis.answers import sweep_answer_of
from runner.analysis.summary import summarize
from test_generation import LAYER, TEXT, TOKENIZER

GENERATE = ("model=gpt2_tiny", "model.vocab_size=61", f"data.tokenizer={TOKENIZER}", *TEXT)


def test_a_generation_run_prints_each_prompt_s_generated_text(tmp_path):
    out = run(make_config(*GENERATE), tmp_path / "run", GENERATE)
    rows = pd.read_parquet(out / "generations.parquet")
    lines = summarize(out).splitlines()
    start = lines.index("  generate: generated from 3 prompt(s), 6 new token(s) each")
    assert lines[start + 1:start + 4] == [f"    {p!r} → {t!r}" for p, t in zip(rows["prompt"], rows["generated_text"])]
    assert all(text.strip() for text in rows["generated_text"])  # vocab_size=61: every id decodes to a word


def test_a_sweep_prints_each_prompt_s_text_per_scale_side_by_side(tmp_path, monkeypatch, capsys):
    vector = tmp_path / "v.npy"
    import numpy as np
    np.save(vector, np.random.default_rng(3).standard_normal(32))
    sweep = tmp_path / "sweep"
    ran = run_main(monkeypatch, capsys, "-m", *GENERATE, "hooks=steer", f"hooks.steer.layers={LAYER}",
                   f"hooks.steer.file={vector}", "hooks.steer.baseline=false", "hooks.steer.scale=0,0.1,0.3",
                   f"hydra.sweep.dir={sweep}", "progress=false")
    assert ran.code == 0, ran.stderr
    rows = load_table(sweep, "generations.parquet")
    texts = {(float(scale), prompt): text for scale, prompt, text in
             zip(rows["hooks.steer.scale"], rows["prompt"], rows["generated_text"])}
    printed = ran.stdout.splitlines()
    start = printed.index("  generated text of 3 job(s) by hooks.steer.scale, per prompt")
    expected = []
    for prompt in TEXT[1].removeprefix("data.prompts=[").removesuffix("]").split(","):
        expected.append(f"  {prompt!r}:")
        expected += [f"    hooks.steer.scale={scale}: {texts[(scale, prompt)]!r}" for scale in (0.0, 0.1, 0.3)]
    assert printed[start + 1:start + 1 + len(expected)] == expected
    assert len({texts[(scale, prompt)] for scale, prompt in texts}) > 3  # the scales changed the text
    table = sweep_answer_of(sweep, {"generate": "generate"}).table
    assert table.columns.tolist()[2:] == [f"hooks.steer.scale={s}" for s in (0.0, 0.1, 0.3)]
    assert table.set_index("prompt")["hooks.steer.scale=0.3"].to_dict() == {
        prompt: text for (scale, prompt), text in texts.items() if scale == 0.3}


def test_the_how_to_page_s_command_runs_as_written_and_prints_what_the_page_shows(tmp_path, monkeypatch, capsys):
    text = section("how-to/generation.md", "Generate with a feature steered")
    command = shlex.split(blocks(text, "bash")[0].replace("\\\n", " "))
    assert command[:3] == ["python", "-m", "runner"]
    monkeypatch.chdir(ROOT)
    ran = run_main(monkeypatch, capsys, *command[3:], f"hydra.sweep.dir={tmp_path / 'sweep'}", "progress=false")
    assert ran.code == 0, ran.stderr
    shown = [line for line in blocks(text, "text")[0].splitlines()[1:] if line.strip() != "..."]
    printed = ran.stdout.splitlines()
    start = printed.index(shown[0])
    assert printed[start:start + len(shown)] == shown
