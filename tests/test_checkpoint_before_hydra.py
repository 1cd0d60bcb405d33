"""A checkpoint that does not fit the model is refused by the command line's check, before Hydra writes
``.hydra/``: one line, status 2, no run directory (the meta-device rehearsal loads it into the meta model)."""
from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import save_file

from runner.sources.models import ConvNet


def _save(path, state):
    if path.suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)


@pytest.mark.parametrize("name", ["bad.pt", "bad.safetensors"])
@pytest.mark.parametrize("change, message", [
    ({"fc.weight": torch.zeros(5, 7)}, "size mismatch for fc.weight"),
    ({"extra.weight": torch.zeros(1)}, 'Unexpected key(s) in state_dict: "extra.weight"'),
])
def test_a_checkpoint_that_does_not_fit_leaves_no_directory(tmp_path, monkeypatch, capsys, name, change, message):
    from runner.__main__ import main

    path = tmp_path / name
    _save(path, {**ConvNet().state_dict(), **change})
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["runner", "model=convnet", f"model.checkpoint={path}", "steps=1",
                                      f"hydra.run.dir={out}"])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert err.startswith(f"error: model.checkpoint: '{path}' does not fit the model: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
