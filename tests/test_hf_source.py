"""``model=hf`` reads a ``save_pretrained`` folder without drawing ``transformers``' progress bar on the terminal,
and leaves the bar's setting of the process as it found it."""
import transformers
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from tests.conftest import run_main


def test_a_folder_loads_without_a_progress_bar_and_the_setting_is_put_back(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=64)).save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        ran = run_main(monkeypatch, capsys, "model=hf", "model.auto=causal_lm", f"model.path={folder}", "data=tokens",
                       "loss=none", "mode=eval", "steps=1", "hooks=extract", "hooks.extract.layers=[transformer.h.0]",
                       "quiet=true", f"hydra.run.dir=run{enabled}")
        assert ran.code == 0, ran.stderr
        assert "Loading weights" not in ran.stderr and "it/s" not in ran.stderr, ran.stderr
        assert transformers.utils.logging.is_progress_bar_enabled() is enabled
    hf_logging.enable_progress_bar()
