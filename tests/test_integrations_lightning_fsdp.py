"""Lightning's FSDP under ``HookCallback``: with FSDP2 (Lightning's ``ModelParallelStrategy``,
``fully_shard`` in ``configure_model``) on two CPU ranks under torchrun, each rank's records equal
the unsharded fit's (marker group ``torchrun``: ``python -m pytest -q -m torchrun FILE``).
Lightning's FSDP1 strategy (``strategy="fsdp"``) does not run on a CPU: Lightning refuses it."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

lightning = pytest.importorskip("lightning")  # the `lightning` extra, part of the `test` extra

import runner.analysis as analysis
from docs_text import section

ROOT = Path(__file__).resolve().parents[1]
IDS = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
STATS = ["mean", "std", "min", "max", "abs_mean", "l2", "zero_frac"]


@pytest.mark.torchrun
def test_each_rank_of_a_lightning_fsdp2_fit_records_what_the_unsharded_fit_records(tmp_path):
    import lightning_fsdp_cases

    text = section("how-to/big-models.md", "Big models")
    command = re.search(r"^torchrun --nproc_per_node=2 tests/lightning_fsdp_cases.py (\S+)$", text, re.M)
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "lightning_fsdp_cases.py", tmp_path / "tests")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(shlex.split(command.group(0)), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    lightning_fsdp_cases.fit(tmp_path / "whole", sharded=False)
    whole = analysis.load_stats(tmp_path / "whole").sort_values(IDS).reset_index(drop=True)
    stats = analysis.load_stats(tmp_path / command.group(1))
    assert sorted(set(stats["rank"])) == [0, 1]
    assert {"param_grad", "output", "grad_output", "clipped"} <= set(whole["kind"]) and set(whole["step"]) == {0, 1, 2}
    for rank in (0, 1):
        mine = stats[stats["rank"] == rank].sort_values(IDS).reset_index(drop=True)
        assert mine[IDS].values.tolist() == whole[IDS].values.tolist()  # the same rows, none missing
        assert mine["tensor_shape"].map(list).tolist() == whole["tensor_shape"].map(list).tolist()
        np.testing.assert_allclose(mine[STATS].to_numpy(float), whole[STATS].to_numpy(float), rtol=2e-4, atol=1e-6)


def test_lightning_s_fsdp1_strategy_refuses_a_cpu():
    """Why the test above uses ``ModelParallelStrategy``: ``strategy="fsdp"`` is Lightning's FSDP1,
    which Lightning itself refuses without a GPU (lightning 2.6)."""
    with pytest.raises(ValueError, match="The strategy `fsdp` requires a GPU accelerator"):
        lightning.Trainer(accelerator="cpu", devices=2, strategy="fsdp", logger=False)
