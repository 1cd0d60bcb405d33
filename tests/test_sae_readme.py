"""The docs' "Sparse autoencoder features" (docs/tutorials/sae.md): its command, as written, gives one ``units.parquet`` row per
feature of the SAE it names (``tests/test_readme_twice.py`` runs it twice: the second is refused)."""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from runner.analysis.units import load_units
from test_readme_steering import run_cli
from docs_text import section

ROOT = Path(__file__).resolve().parents[1]
SECTION = section("tutorials/sae.md", "Sparse autoencoder features")


def test_the_readme_s_sae_command_gives_each_feature_s_statistics(tmp_path, monkeypatch, capsys):
    (command,) = [block.split("```", 1)[0] for block in SECTION.split("```bash\n")[1:]]
    shutil.copytree(ROOT / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    monkeypatch.chdir(tmp_path)
    assert run_cli(shlex.split(command.replace("\\\n", " ")), monkeypatch) in (0, None)
    units = load_units(tmp_path / "runs" / "sae")
    assert sorted(units.unit) == list(range(8)) and set(units.layer) == {"transformer.h.0.sae"}
    assert (units["count"] == 4 * 2 * 16).all()  # 4 steps of 2 sequences of 16 tokens
