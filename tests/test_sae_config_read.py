"""An ``sae`` entry reads its SAELens folder's ``cfg.json`` once for a whole run (checked when the entry is
built, then handed to the width check and the loader, in the plan's rehearsal and in the run)."""
from __future__ import annotations

from pathlib import Path

from conftest import make_config, run
from sae_folders import random_saelens


def test_cfg_json_is_read_once_per_run(tmp_path, monkeypatch):
    folder = random_saelens(tmp_path / "sae", 32)
    reads = []
    read_text = Path.read_text

    def counted(path: Path, *args, **kwargs) -> str:
        if path.name == "cfg.json":
            reads.append(path)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    overrides = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2", "hooks=sae",
                 "hooks.sae.layers=transformer.h.0", f"hooks.sae.path={folder}", "hooks.sae.features=[1]",
                 "hooks.sae.op=ablate")
    out = run(make_config(*overrides), tmp_path / "run", overrides)
    assert (out / "manifest.json").is_file()
    assert reads == [folder / "cfg.json"]
