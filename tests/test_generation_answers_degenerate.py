"""A generation run whose outputs coincide answers like any other: one prompt, or prompts that all generate
the same tokens (a steering scale of 4 on gpt2_tiny), end with status 0 and each prompt's text, and
``python -m runner.report`` on them writes its page (``generated_ids`` comes back from the loaders as a
categorical of one value there, which ``Series.map(len)`` keeps categorical: it has no ``min``)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import run_main
from runner.analysis.report import main as report_main
from test_generation import LAYER, TOKENIZER

ONE_PROMPT = ("data.prompts=[a dog]",)
#: Three prompts a vector of scale 4 added at the first block drives to one word, repeated.
SAME_OUTPUTS = ("data.prompts=[the cat sees the,a dog,king and queen love]", "hooks=steer",
                f"hooks.steer.layers={LAYER}", "hooks.steer.baseline=false", "hooks.steer.scale=4")


@pytest.mark.parametrize("words", [ONE_PROMPT, SAME_OUTPUTS], ids=["one prompt", "identical outputs"])
def test_a_generation_run_whose_outputs_coincide_prints_its_answer_and_its_report(tmp_path, monkeypatch, capsys,
                                                                                  words):
    vector = tmp_path / "v.npy"
    np.save(vector, np.random.default_rng(3).standard_normal(32))
    out = tmp_path / "run"
    ran = run_main(monkeypatch, capsys, "model=gpt2_tiny", "model.vocab_size=61", "data=text",
                   f"data.tokenizer={TOKENIZER}", "mode=generate", "loss=none", "generate.max_new_tokens=4",
                   *words, f"hooks.steer.file={vector}" if "hooks=steer" in words else "progress=false",
                   f"hydra.run.dir={out}", "progress=false")
    assert ran.code == 0, ran.stderr
    rows = pd.read_parquet(out / "generations.parquet")
    if words is SAME_OUTPUTS:
        assert rows["generated_ids"].map(tuple).nunique() == 1  # the case at hand: every prompt, the same tokens
    printed = ran.stdout.splitlines()
    start = printed.index(f"  generate: generated from {len(rows)} prompt(s), 4 new token(s) each")
    assert printed[start + 1:start + 1 + len(rows)] == [
        f"    {prompt!r} → {text!r}" for prompt, text in zip(rows["prompt"], rows["generated_text"])]
    report_main([str(out)])  # status 0: it returns (a failure exits, a crash raises)
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    page = (out / "report.html").read_text()
    assert f"generated from {len(rows)} prompt(s), 4 new token(s) each" in page
