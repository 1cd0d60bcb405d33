"""With ``data=image`` the image file is read once per run: the batch and the manifest's fingerprint
come from the same bytes (they were read twice: once decoded, once hashed for ``provenance``)."""
from __future__ import annotations

import builtins
import io
import json
from pathlib import Path

from conftest import cli
from common.fingerprint import describe_file

IMAGE = Path(__file__).resolve().parents[1] / "assets" / "house.png"


def test_the_image_is_read_once_and_its_fingerprint_is_the_files(tmp_path, monkeypatch):
    opened = []
    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(IMAGE):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    cli(["model=convnet", "data=image", f"data.path={IMAGE}", "data.resize=8", "data.crop=8", "steps=1", "hooks=none"],
        tmp_path / "run")
    monkeypatch.undo()
    assert len(opened) == 1
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["provenance"]["data"]["path"] == describe_file(str(IMAGE))
