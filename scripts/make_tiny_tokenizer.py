"""Write ``tests/fixtures/tiny_tokenizer``: a word-level tokenizer of 59 words and 2 special tokens, made offline.

The tests of ``data=text`` and ``mode=generate`` need a tokenizer that fits ``model=gpt2_tiny``
(``vocab_size=100``) and needs no download. Id 0 is ``<|endoftext|>`` (gpt2_tiny's bos and eos,
and the pad token), id 1 ``[UNK]``; the words are lower-case English. Run from the repository root:
``python scripts/make_tiny_tokenizer.py``.
"""
from __future__ import annotations

from pathlib import Path

WORDS = ("the a an and or but of to in on at with from by for is was are were be been it this that "
         "cat dog bird fish tree house river city king queen man woman child love hate good bad happy sad "
         "big small red blue green old new sun moon sea day night says sees runs eats").split()
SPECIAL = ("<|endoftext|>", "[UNK]")
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny_tokenizer"


def make(out: Path = OUT) -> Path:
    """Build the tokenizer and ``save_pretrained`` it into ``out``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL, *WORDS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIAL[0], eos_token=SPECIAL[0],
                                        pad_token=SPECIAL[0], unk_token=SPECIAL[1])
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(f"wrote {make()} ({len(SPECIAL) + len(WORDS)} tokens)")
