"""``python -m runner`` under torchrun with ``fsdp.enabled=true``: the model the config builds is
sharded with FSDP2 over two CPU ranks (gloo), and each rank's rows equal the same command's
unsharded run in one process. The launch is in the marker group ``torchrun``
(``python -m pytest -q -m torchrun tests/test_fsdp_cli.py``); the refusals run in the default suite."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import runner.analysis as analysis
from omegaconf import OmegaConf

from common.errors import ConfigError
from conftest import cli, make_config
from runner.cli.callbacks import EarlyChecks
from runner.cli.commandline import check_command_line
from runner.analysis.summary import summarize_run
from runner.engine.plan import compile_plan
from runner.engine.fsdp import LAUNCH_ENV
from docs_text import section

ROOT = Path(__file__).resolve().parents[1]
IDS = ["step", "hook", "layer", "phase", "kind", "slot", "call"]
STATS = ["mean", "std", "min", "max", "abs_mean", "l2", "zero_frac"]


def readme_command() -> str:
    return re.search(r"^torchrun --nproc_per_node=2 -m runner .*$", section("how-to/big-models.md", "Big models"),
                     re.M).group(0)


def rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(IDS).reset_index(drop=True)


@pytest.mark.torchrun
def test_the_readme_command_gives_each_rank_the_rows_of_the_unsharded_run(tmp_path):
    command = readme_command()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1  # rank 0 alone says what the run wrote
    overrides = [o for o in shlex.split(command)[4:] if not o.startswith(("fsdp.", "hydra."))]
    cli([*overrides, "quiet=true"], tmp_path / "whole")
    whole = rows(analysis.load_stats(tmp_path / "whole"))
    stats = analysis.load_stats(tmp_path / "runs" / "fsdp_cli")
    assert sorted(set(stats["rank"])) == [0, 1]
    assert {"param_grad", "output", "grad_output", "clipped"} <= set(whole["kind"])
    for rank in (0, 1):
        mine = rows(stats[stats["rank"] == rank])
        assert mine[IDS].values.tolist() == whole[IDS].values.tolist()  # the same rows, none missing
        assert mine["tensor_shape"].map(list).tolist() == whole["tensor_shape"].map(list).tolist()
        np.testing.assert_allclose(mine[STATS].to_numpy(float), whole[STATS].to_numpy(float), rtol=2e-4, atol=1e-6)
    steps = analysis.load_steps(tmp_path / "runs" / "fsdp_cli")
    whole_steps = analysis.load_steps(tmp_path / "whole")
    for rank in (0, 1):  # the trained weights are the unsharded run's: so are the losses of step 1
        np.testing.assert_allclose(steps[steps["rank"] == rank].sort_values("step")["loss"].to_numpy(),
                                   whole_steps.sort_values("step")["loss"].to_numpy(), rtol=1e-5)
    # The summary counts each gradient and element once, as the unsharded run's does (not each rank's).
    clip_line = [line for line in summarize_run(tmp_path / "whole") if "clipped" in line]
    assert len(clip_line) == 1 and clip_line[0] in summarize_run(tmp_path / "runs" / "fsdp_cli")


LAUNCHED = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


def test_fsdp_outside_torchrun_or_with_compile_is_refused_in_one_line_by_the_gate(monkeypatch):
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as refused:
        compile_plan(make_config("model=mlp", "hooks=stats", "fsdp.enabled=true"))
    assert str(refused.value) == ("fsdp.enabled: true shards the model over the ranks torchrun launches, and this "
                                  "process is not one of them (no RANK/WORLD_SIZE); run it as torchrun "
                                  "--nproc_per_node=2 -m runner ...")
    compile_plan(make_config("model=mlp", "hooks=stats", "fsdp.enabled=true", "plan=true"))  # a plan runs nothing
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"^fsdp.enabled: true with compile=true is not built; use one of them$"):
        compile_plan(make_config("model=mlp", "hooks=stats", "fsdp.enabled=true", "compile=true"))


def test_fsdp_without_the_run_directory_is_refused_in_one_line_before_hydra_writes(monkeypatch, tmp_path, capsys):
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    config = OmegaConf.create({"plan": False, "overwrite": False, "fsdp": {"enabled": True},
                               "hydra": {"overrides": {"hydra": []}, "run": {"dir": str(tmp_path / "out")}}})
    with pytest.raises(SystemExit) as exited:
        EarlyChecks().on_run_start(config)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: fsdp.enabled: every rank writes into one run directory, and each rank's clock would name another; "
        "give it: hydra.run.dir=DIR"]
    config.hydra.overrides.hydra = [f"hydra.run.dir={tmp_path / 'out'}"]
    EarlyChecks().on_run_start(config)  # given: rank 0 claims it once the ranks run (runner.store.ranks)
    assert not (tmp_path / "out").exists()


SWEEP_LINE = ("error: fsdp.enabled: a sweep (-m) under torchrun runs every job in each rank's one process, where a job "
              "that fails on one rank leaves the others waiting; run each job as its own torchrun command without -m")
SWEEP = ["-m", "model=mlp", "hooks=stats", "optimizer=sgd", "steps=1,2", "fsdp.enabled=true"]


def test_a_sweep_of_an_fsdp_run_is_refused_by_the_command_line_check(monkeypatch):
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    assert check_command_line(SWEEP).problems == [SWEEP_LINE.removeprefix("error: ")]
    assert check_command_line([*SWEEP, "plan=true"]).problems == []  # a plan shards nothing
    assert check_command_line([o.replace("1,2", "2") for o in SWEEP[1:]]).problems == []  # one run: not a sweep
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name)
    outside = check_command_line(SWEEP).problems  # outside torchrun the gate refuses each job (check_fsdp)
    assert len(outside) == 3 and all("(no RANK/WORLD_SIZE)" in line for line in outside[1:])

@pytest.mark.torchrun
def test_a_sweep_of_an_fsdp_run_under_torchrun_is_refused_with_status_2_before_anything_is_written(tmp_path):
    """Hydra's basic launcher would run both jobs in each rank's process, in sweep directories each rank's
    clock names apart: each rank says the one line and exits with status 2 (unless torchrun ended it once
    the first had), and nothing is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["torchrun", "--nproc_per_node=2", "--tee=2", "-m", "runner", *SWEEP,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0
    ranks = re.findall(r"^\[default(\d)\]:(.*)$", done.stdout + done.stderr, re.M)
    said = [(rank, line) for rank, line in ranks if line.startswith("error:")]
    assert said and all(line == SWEEP_LINE for _, line in said) and len(said) == len(set(said))
    assert not any("Traceback" in line for _, line in ranks)  # the ranks' own lines (torchrun adds its own report)
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", done.stderr))
    assert "2" in codes and codes <= {"2", "-15"}  # torchrun ends a rank still exiting when the first fails (SIGTERM)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no sweep directory, no outputs/
