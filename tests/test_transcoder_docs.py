"""The transcoders how-to (``docs/how-to/transcoders.md``): its commands run as written (the fixture they name,
``tests/fixtures/transcoders_gpt2_tiny``, is what ``transcoder_folders.circuit_tracer_transcoders`` makes), and
give what the page says: every block's features as
units; an ablation of feature 3 moving block 0's MLP output by ``-f_3 W_dec[3]``, ``f_3`` computed by hand in
float64 from the MLP input the run kept; and the error line it shows, for an SAE's folder."""
from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import run_main
from docs_text import blocks, section
from runner.analysis import load_tensors
from runner.analysis.units import load_units
from transcoder_folders import circuit_tracer_transcoders

pytestmark = pytest.mark.statistics

PAGE = "how-to/transcoders.md"
FIXTURES = Path(__file__).parent / "fixtures"
FOLDER = FIXTURES / "transcoders_gpt2_tiny"


def ran(monkeypatch, capsys, command: str) -> Path:
    """Run the page's ``command``; the run directory it made."""
    before = set(Path("outputs").glob("runs/*/*")) if Path("outputs").is_dir() else set()
    done = run_main(monkeypatch, capsys, *shlex.split(command)[3:])
    assert done.code == 0, done.stderr
    (made,) = set(Path("outputs").glob("runs/*/*")) - before
    return made


def kept(run: Path, layer: str, kind: str) -> np.ndarray:
    tensors = load_tensors(run)
    tensors = tensors[(tensors.layer == layer) & (tensors.kind == kind)].sort_values("step")
    return np.concatenate(list(tensors.tensor))


def test_the_fixture_the_page_names_is_the_helper_s_skip_jumprelu_folder(tmp_path):
    made = circuit_tracer_transcoders(tmp_path / "made", 2, 32, skip=True, jumprelu=True)
    assert sorted(p.name for p in FOLDER.iterdir()) == sorted(p.name for p in made.iterdir())
    assert (FOLDER / "config.yaml").read_text() == (made / "config.yaml").read_text()
    for block in (0, 1):
        fixed, fresh = (load_file(f / f"layer_{block}.safetensors") for f in (FOLDER, made))
        assert fixed.keys() == fresh.keys() and all(torch.equal(fixed[k], fresh[k]) for k in fixed)


def test_the_page_s_commands_run_as_written_and_give_what_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(FIXTURES)
    folder = FOLDER
    units_command, = blocks(section(PAGE, "Splice a transcoder at every block and find each feature's top examples"),
                            "bash")
    units = load_units(ran(monkeypatch, capsys, units_command.strip()))
    assert sorted(set(units.layer)) == ["transformer.h.0.mlp.transcoder", "transformer.h.1.mlp.transcoder"]
    assert sorted(units.unit.unique()) == list(range(8)) and len(units) == 16
    assert (units["max"] > 0).any()

    edit_command, = blocks(section(PAGE, "Edit a feature"), "bash")
    edited = ran(monkeypatch, capsys, edit_command.strip())
    unedited = ran(monkeypatch, capsys, edit_command.replace(" 'hooks.transcoder.features=[3]' hooks.transcoder.op=ablate",
                                                             "").strip())
    a = torch.from_numpy(kept(edited, "transformer.h.0.mlp", "input")).double()
    np.testing.assert_array_equal(a.numpy(), kept(unedited, "transformer.h.0.mlp", "input"))
    w = {name: t.double() for name, t in load_file(folder / "layer_0.safetensors").items()}
    pre = a @ w["W_enc"].T + w["b_enc"]
    f3 = (pre * (pre > w["activation_function.threshold"]))[..., 3]
    assert (f3 != 0).any()
    moved = kept(edited, "transformer.h.0.mlp", "output") - kept(unedited, "transformer.h.0.mlp", "output")
    np.testing.assert_allclose(moved, (-f3.unsqueeze(-1) * w["W_dec"][3]).numpy(), atol=1e-5, rtol=0)

    shown, = blocks(section(PAGE, "Mistakes are one line"), "text")
    runs = set(Path("outputs").glob("runs/*/*"))
    refused = run_main(monkeypatch, capsys, "model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval",
                       "hooks=transcoder", "hooks.transcoder.path=tests/fixtures/sae_standard")
    assert (refused.code, refused.stderr.strip()) == (2, shown.strip())
    assert set(Path("outputs").glob("runs/*/*")) == runs  # nothing written
