"""An ``sae`` entry's weights are what it holds on the host: ``plan=true`` states them and ``memory.budget``
counts them, as the bytes of the SAE's tensors loaded by hand, for every architecture."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file

from conftest import cli, make_config
from runner.engine.budget import held, size_text
from runner.engine.plan import compile_plan, describe
from sae_folders import SAVED, random_saelens

#: An MLP, which the meta device runs whole (the plan's rehearsal), its SAE reading fc1's 200 outputs.
MLP = ("model=mlp", "data.shape=[8,100]", "hooks=sae", "hooks.sae.layers=fc1")


@pytest.mark.parametrize("architecture", SAVED)
def test_the_sae_s_weights_are_stated_as_the_bytes_of_its_tensors(tmp_path, architecture):
    folder = random_saelens(tmp_path / "sae", 200, d_sae=16, architecture=architecture)
    tensors = load_file(folder / "sae_weights.safetensors")
    if architecture == "batchtopk":  # held as sae-lens's inference SAE holds it: a float32 threshold per feature
        tensors["threshold"] = tensors.pop("topk_threshold").float().expand(16)
    real = sum(t.numel() * t.element_size() for t in tensors.values())  # standard: (2 x 200 x 16 + 16 + 200) x 4
    plan = compile_plan(make_config(*MLP, f"hooks.sae.path={folder}"))
    assert [(key, what, n) for key, what, n in held(plan.rehearsal)] == [("sae", "SAE weights", real)]
    assert f"  hooks.sae: {size_text(real)} of SAE weights" in describe(plan)


def test_a_budget_the_sae_s_weights_exceed_is_refused_in_one_line_before_the_run(tmp_path, capsys):
    folder = random_saelens(tmp_path / "sae", 200, d_sae=16)
    with pytest.raises(SystemExit) as exited:
        cli([*MLP, f"hooks.sae.path={folder}", "memory.budget=25KiB"], tmp_path / "run")
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: memory.budget: the entries hold 25.8 KiB on cpu (hooks.sae 25.8 KiB of SAE weights), over the budget "
        "of 25.0 KiB; select fewer layers, record fewer samples (sample.batch=N), lower a store's shard_size, or "
        "raise memory.budget"]
    assert not (tmp_path / "run").exists()
