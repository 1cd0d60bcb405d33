"""``data=text`` forward passes say how many prompts are padded, before the run (``warn_of_pads``): the pads
are computed like tokens, so ``units``/``stats`` count them and position -1 is a pad for a shorter prompt."""
from __future__ import annotations

import warnings

import pytest

from conftest import make_config
from runner.engine.plan import compile_plan
from runner.sources.text import PaddedPromptsWarning
from test_sae import FIXTURES

TEXT = ("model=gpt2_tiny", "model.vocab_size=61", "data=text", f"data.tokenizer={FIXTURES / 'tiny_tokenizer'}",
        "loss=none")


def said(*overrides: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_plan(make_config(*TEXT, *overrides))
    return [str(w.message) for w in caught if issubclass(w.category, PaddedPromptsWarning)]


def test_prompts_of_different_lengths_are_said_to_be_padded_before_a_forward_pass():
    lines = said("mode=eval", "data.prompts=[the cat sees the bird,a dog,the sad king runs]")
    assert lines == ["data=text: 2 of 3 prompts are shorter than the longest (5 tokens) and padded on the right "
                     "with token 0, which forward passes compute too: units and stats count the pads, and "
                     "position -1 is a pad for those prompts; give prompts of one length to leave them out"]


@pytest.mark.parametrize("overrides", [("mode=eval", "data.prompts=[the cat sees,a dog runs]"),
                                       ("mode=generate", "data.prompts=[the cat sees the bird,a dog]")],
                         ids=["one length", "generate masks the pads"])
def test_nothing_is_said_where_no_pad_is_computed(overrides):
    assert said(*overrides) == []


def test_the_prompts_are_tokenized_once_and_again_when_their_file_changes(tmp_path):
    from runner.sources.text import prompt_set

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sees\na dog\n")
    config = make_config(*TEXT, "mode=eval", f"data.path={prompts}")
    first = prompt_set(config.data, config.model)
    assert prompt_set(config.data, config.model) is first  # the data kind, the gate and generation share it
    prompts.write_text("the cat sees\na dog\nthe sad king runs\n")
    assert prompt_set(config.data, config.model).texts == ("the cat sees", "a dog", "the sad king runs")
