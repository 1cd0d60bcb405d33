"""The docs' "Sparse autoencoder features" (docs/tutorials/sae.md), its commands as written: the first gives one
``units.parquet`` row per feature of the SAE it names; "A feature's top prompts, then the text it steers" prints
the lines the page shows, its top prompts are those of the features encoded by hand (float64, from the
safetensors weights) of gpt2_tiny's block output, its generated text is ``model.generate``'s with the steering
added by a hand-written hook, and its picture script draws from the two runs' files
(``tests/test_readme_twice.py`` runs the commands that name a directory twice: the second is refused)."""
from __future__ import annotations

import runpy
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import run_main
from docs_text import blocks, section
from runner.analysis.load import load_table
from runner.analysis.units import load_unit_examples, load_units, top_units
from runner.sources.models import gpt2_tiny
from test_readme_steering import run_cli

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
SECTION = section("tutorials/sae.md", "Sparse autoencoder features")
STORY = section("tutorials/sae.md", "A feature's top prompts, then the text it steers")
FIXTURES = ROOT / "tests" / "fixtures"


def words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


def test_the_readme_s_sae_command_gives_each_feature_s_statistics(tmp_path, monkeypatch, capsys):
    command = blocks(SECTION.split("## ", 1)[0], "bash")[0]
    shutil.copytree(FIXTURES, tmp_path / "tests" / "fixtures")
    monkeypatch.chdir(tmp_path)
    assert run_cli(words(command), monkeypatch) in (0, None)
    units = load_units(tmp_path / "runs" / "sae")
    assert sorted(units.unit) == list(range(8)) and set(units.layer) == {"transformer.h.0.sae"}
    assert (units["count"] == 4 * 2 * 16).all()  # 4 steps of 2 sequences of 16 tokens


def hand_model() -> torch.nn.Module:
    """gpt2_tiny as the run builds it (seed 0, the tokenizer's 61 ids), in float64."""
    torch.manual_seed(0)
    return gpt2_tiny(vocab_size=61).eval()


def hand_features(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The right-padded prompts' ids and the standard SAE's features of ``transformer.h.0``'s output at each
    token ``[prompts, positions, features]``, encoded by hand in float64."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURES / "tiny_tokenizer"), local_files_only=True)
    ids = tokenizer(prompts, padding=True, return_tensors="pt")["input_ids"]
    model = hand_model().double()
    kept = []
    model.transformer.h[0].register_forward_hook(lambda m, a, out: kept.append(out))  # a block returns a tensor
    with torch.no_grad():
        model(ids)
    w = {k: v.double() for k, v in load_file(FIXTURES / "sae_standard" / "sae_weights.safetensors").items()}
    return ids, torch.relu((kept[0] - w["b_dec"]) @ w["W_enc"] + w["b_enc"])


def hand_generated(prompts: list[str], feature: int, value: float, new: int) -> list[str]:
    """``model.generate`` (greedy, left-padded) with ``value`` added to the feature by a hook on the block: the
    standard SAE decodes linearly, so the splice's output is the block's plus ``value`` times its decoder row."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURES / "tiny_tokenizer"), local_files_only=True)
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    model = hand_model()
    row = load_file(FIXTURES / "sae_standard" / "sae_weights.safetensors")["W_dec"][feature]
    model.transformer.h[0].register_forward_hook(lambda m, a, out: out + value * row)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new, pad_token_id=0, do_sample=False)
    return [tokenizer.decode(r, skip_special_tokens=True) for r in out[:, enc["input_ids"].shape[1]:]]


def shown_in(printed: str, shown: str) -> None:
    """The page's lines are what the command printed, in a row."""
    lines, want = printed.splitlines(), shown.rstrip("\n").splitlines()
    assert want[0] in lines, (want[0], printed)
    start = lines.index(want[0])
    assert lines[start:start + len(want)] == want


def test_the_story_s_commands_run_as_written_and_name_the_hand_computed_top_prompts(tmp_path, monkeypatch, capsys):
    units_command, sweep_command, picture_command = blocks(STORY, "bash")
    units_shown, sweep_shown = blocks(STORY, "text")
    shutil.copytree(FIXTURES, tmp_path / "tests" / "fixtures")
    monkeypatch.chdir(tmp_path)
    ran = run_main(monkeypatch, capsys, *words(units_command)[3:])
    assert ran.code == 0, ran.stderr
    shown_in(ran.stdout, units_shown)

    prompts = [line for line in (FIXTURES / "tiny_prompts.txt").read_text().splitlines() if line.strip()]
    ids, features = hand_features(prompts)
    assert (ids != 1).all()  # every word is the tokenizer's: no [UNK]
    per_prompt = features.max(dim=1).values  # [prompts, features]: a sample's value is its largest over positions
    top = top_units("runs/sae_prompts", "transformer.h.0.sae", k=8)
    for unit, rows in top.groupby("unit"):
        order = sorted(range(len(prompts)), key=lambda i: (-float(per_prompt[i, unit]), i))[:len(rows)]
        assert list(rows.sort_values("rank").input) == [prompts[i] for i in order], unit
        np.testing.assert_allclose(rows.sort_values("rank").value, per_prompt[order, unit].numpy(), rtol=1e-5)
    examples = load_unit_examples("runs/sae_prompts")
    examples = examples[examples.value > 0]  # the pads are scored too: no top example is a pad's value
    assert all(position < len(prompts[sample].split())
               for sample, position in zip(examples["sample"], examples.position))
    alive = per_prompt.max(dim=0).values > 0
    shown_units = [int(line.split()[1].rstrip(":")) for line in units_shown.splitlines()
                   if line.strip().startswith("unit ")]
    assert shown_units == sorted(np.flatnonzero(alive.numpy()), key=lambda u: -float(per_prompt[:, u].max()))[:3]
    assert f"8 units, {int((~alive).sum())} dead" in units_shown

    ran = run_main(monkeypatch, capsys, *words(sweep_command)[3:])
    assert ran.code == 0, ran.stderr
    shown_in(ran.stdout, sweep_shown)
    feature = int(words(sweep_command)[[w.startswith("hooks.sae.features=") for w in words(sweep_command)].index(True)]
                  .split("=[")[1].rstrip("]"))
    assert feature == shown_units[0]  # the top feature is the one steered
    texts = load_table("runs/sae_steer", "generations.parquet")
    steered = list(texts.prompt.unique())
    by_feature = sorted(range(len(prompts)), key=lambda i: (-float(per_prompt[i, feature]), i))
    assert steered == [prompts[i] for i in by_feature[:2]]  # its two top prompts
    for value, rows in texts.groupby("hooks.sae.value"):
        assert list(rows.sort_values("sample").generated_text) == hand_generated(steered, feature, float(value), 5)
    assert texts["generated_text"].nunique() > 2  # the steering changed the text

    picture = words(picture_command)
    assert picture[:2] == ["python", "assets/make_sae_picture.py"]
    monkeypatch.setattr(sys, "argv", picture[1:])
    script = runpy.run_path(str(ROOT / picture[1]), run_name="__main__")
    assert Path(picture[-1]).stat().st_size > 20_000
    drawn_prompts, tokens, values = script["feature_tokens"](Path(picture[2]), feature)  # what the picture shows
    order = sorted(range(len(prompts)), key=lambda i: (-float(per_prompt[i, feature]), i))[:4]
    assert drawn_prompts == [prompts[i] for i in order]
    assert [t[:len(p.split())] for t, p in zip(tokens, drawn_prompts)] == [p.split() for p in drawn_prompts]
    np.testing.assert_allclose(values, features[order, :, feature].numpy(), rtol=1e-5, atol=1e-6)
    assert f"![Feature {feature}'s activation" in STORY and f"(../assets/{Path(picture[-1]).name})" in STORY
