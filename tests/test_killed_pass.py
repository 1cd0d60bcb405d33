"""A whole-dataset pass killed by a signal (SIGKILL, SIGTERM: no exception, no cleanup) mid-shard, then
run again: its store and its unit statistics end equal to an uninterrupted pass's.

The killed pass is ``python -m runner`` in a subprocess whose dataset stops at item 730 (``DigitsPausingAt``)
until the test sends the signal: items 0..699 have been through the model, shards 0-2 (0..599) are
complete, the next 100 rows were in memory only. The pass run again writes the same run directory.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import make_config, run
from runner.analysis.units import load_units
from runner.store.activations import ActivationStore

ROOT = Path(__file__).resolve().parents[1]
PASS = ("model=digits_cnn", "data=dataset", "data._target_=datasets_for_tests.DigitsPausingAt", "data.batch_size=50",
        "data.shuffle=false", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=[units,store]",
        "hooks.units.layers=[conv1,fc]", "hooks.units.top_k=4", "hooks.units.second_moment=true",
        "hooks.store.layers=[fc]", "hooks.store.shard_size=200")


def killed_at_item_730(out: Path, store: Path, signum: int) -> None:
    """``python -m runner`` over the digits into ``out``, killed with ``signum`` while it reads item 730."""
    flag = out.parent / "paused"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, "-m", "runner", *PASS, f"hooks.store.path={store}", f"hydra.run.dir={out}",
                             "+data.kwargs.pause_at=730", f"+data.kwargs.flag={flag}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the pass never reached item 730"
        time.sleep(0.1)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) in (-signum, 128 + signum)  # the CLI ends on SIGTERM with 143


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, Path]:
    """The pass run whole: its run directory and its store."""
    root = tmp_path_factory.mktemp("uninterrupted")
    return run(make_config(*PASS, f"hooks.store.path={root / 'store'}"), root / "run"), root / "store"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM],
                         ids=["SIGKILL", "SIGTERM"])  # a run ended by SIGTERM in-process: test_faults.py
def test_a_pass_killed_by_a_signal_runs_again_to_the_uninterrupted_store_and_units(tmp_path, uninterrupted, signum):
    whole, whole_store = uninterrupted
    out, store = tmp_path / "killed", tmp_path / "store"
    killed_at_item_730(out, store, signum)
    assert not (out / "manifest.json").exists()  # nothing committed: no run to read
    left = json.loads((store / "fc" / "store.json").read_text())
    assert [s["rows"] for s in left["shards"]] == [200, 200, 200] and not left["complete"]
    with pytest.raises(FileNotFoundError, match="no complete activation store"):
        ActivationStore(store / "fc")
    # what a writer killed inside a shard would leave: a temporary file, or a shard file never listed
    half = (whole_store / "fc" / "shard-00003.safetensors").read_bytes()[:1000]
    (store / "fc" / "shard-00003.safetensors").write_bytes(half)
    (store / "fc" / ".shard-00003.safetensors.tmp-99999").write_bytes(half)

    again = run(make_config(*PASS, f"hooks.store.path={store}"), out)
    assert not list((store / "fc").glob(".*"))
    done = json.loads((store / "fc" / "store.json").read_text())
    assert done == json.loads((whole_store / "fc" / "store.json").read_text()) and done["complete"]
    for name in sorted(p.name for p in (whole_store / "fc").glob("*.safetensors")):
        got, want = load_file(store / "fc" / name), load_file(whole_store / "fc" / name)
        assert all(torch.equal(got[k], want[k]) for k in ("activations", "samples")), name
    assert [ActivationStore(store / "fc")[i][1] for i in range(1797)] == list(range(1797))
    units, expected = load_units(again), load_units(whole)
    assert len(units) == len(expected) > 0 and (units["count"][units.layer == "fc"] == 1797).all()
    for column in expected.columns:
        assert all(np.array_equal(a, b) for a, b in zip(units[column], expected[column])), column
