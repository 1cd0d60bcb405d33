"""Live loggers against real tracking: an ``mlflow server`` this test starts on localhost, read back with
``MlflowClient.get_metric_history``; a sweep's jobs grouped (one W&B group, one MLflow parent run with
its children); a server killed mid-run costs one warning. Marker ``tracking``: the server starts slowly."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import runner
import runner.analysis as analysis
from logged_values import expected_scalars
from mlflow_server import mlflow_server, stop
from runner.live import LoggerWarning
from runner.live.to_mlflow import SWEEP_TAG, metric_key
from wandb_files import offline_runs
from docs_text import blocks, section

pytestmark = pytest.mark.tracking
if TYPE_CHECKING:
    from mlflow import MlflowClient
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as (uri, _):
        yield uri


def tracking_client(uri: str) -> MlflowClient:
    """mlflow's client of ``uri``: mlflow (1.2 s of imports) is imported here, not when the default suite, whose
    every xdist worker collects this file, leaves its tests out."""
    from mlflow import MlflowClient

    return MlflowClient(uri)


def logged_metrics(client: MlflowClient, run_id: str, expected: dict) -> dict:
    """``{(step, tag): value}`` read back for every tag of ``expected`` (and the run's keys, all of them)."""
    keys = set(client.get_run(run_id).data.metrics)
    assert keys == {metric_key(tag) for _, tag in expected}
    return {(m.step, tag): m.value for tag in {tag for _, tag in expected}
            for m in client.get_metric_history(run_id, metric_key(tag))}


def train(out, steps, logger, kill_after=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with runner.attach(model, hooks={"stats": {"type": "stats", "layers": "**"}}, out_dir=out, logger=logger) as run:
        for i in range(steps):
            loss = nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.randint(0, 2, (6,)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.step(loss)
            if i == 1:
                with torch.no_grad(), run.evaluating() as result:
                    result.set(nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.randint(0, 2, (6,))))
            if kill_after is not None and i == kill_after[0]:
                kill_after[1]()
        return time.monotonic()  # when the run's end began: its loggers close after this


def test_mlflow_metric_history_equals_the_parquet_values(server, tmp_path):
    out = tmp_path / "run"
    train(out, 4, {"mlflow": {"tracking_uri": server, "experiment": "single", "close_timeout_s": 600}})
    client = tracking_client(server)
    (run,) = client.search_runs([client.get_experiment_by_name("single").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    expected = expected_scalars(out)
    assert any("/(model)/" in tag for _, tag in expected)  # a name MLflow refuses, logged as metric_key(tag)
    assert logged_metrics(client, run.info.run_id, expected) == expected  # doubles: exactly the parquet values
    assert run.data.params["overrides"] == "hooks=[]" and run.data.params["hooks.stats.layers"] == "**"


def test_a_sweep_of_4_jobs_is_one_wandb_group_and_one_mlflow_parent_with_4_children(server, tmp_path):
    sweep = tmp_path / "sweep"
    subprocess.run([sys.executable, "-m", "runner", "-m", "seed=0,1,2,3", "model=linear", "hooks=stats", "quiet=true",
                    "progress=false", "logger=[wandb,mlflow]", f"logger.mlflow.tracking_uri={server}",
                    "logger.mlflow.experiment=sweep", "logger.mlflow.close_timeout_s=600",
                    "logger.wandb.close_timeout_s=600", f"hydra.sweep.dir={sweep}"], cwd=REPO, check=True)
    jobs = [sweep / str(i) for i in range(4)]
    for job in jobs:
        (logged,) = offline_runs(job / "wandb")
        assert logged.run.run_group == str(sweep.resolve()) and logged.run.display_name == job.name
        assert logged.scalars() == expected_scalars(job)
    client = tracking_client(server)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    (parent,) = [r for r in runs if SWEEP_TAG in r.data.tags]
    assert parent.data.tags[SWEEP_TAG] == str(sweep.resolve())
    children = sorted((r for r in runs if r is not parent), key=lambda r: r.info.run_name)
    assert [r.info.run_name for r in children] == ["0", "1", "2", "3"]
    for job, child in zip(jobs, children):
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["seed"] == job.name
        expected = expected_scalars(job)
        assert logged_metrics(client, child.info.run_id, expected) == expected


def test_a_server_killed_mid_run_costs_one_warning_and_the_parquet_files_are_complete(tmp_path):
    with mlflow_server(tmp_path) as (uri, process):
        client = tracking_client(uri)

        def kill():  # once the server holds step 0's loss: it was logging, then it is gone
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                found = client.search_runs([e.experiment_id for e in client.search_experiments()])
                if found and client.get_metric_history(found[0].info.run_id, "train/loss"):
                    break
                time.sleep(0.2)
            stop(process)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ending = train(tmp_path / "run", 8, {"mlflow": {"tracking_uri": uri}}, kill_after=(0, kill))
    said = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]
    assert len(said) == 1 and said[0].startswith(f"logger mlflow: its server {uri} is unreachable ("), said
    assert time.monotonic() - ending < 15  # not close_timeout_s (60 s by default): a refusing server is given up
    steps = analysis.load_steps(tmp_path / "run")
    assert steps[["step", "split"]].values.tolist() == [[0, "train"], [1, "train"], [1, "eval"],
                                                        *[[i, "train"] for i in range(2, 8)]]
    assert sorted(set(analysis.load_stats(tmp_path / "run").step)) == list(range(8))


def live_dashboards_commands() -> list[str]:
    """The command lines of the first block of the docs' "Live dashboards", as written."""
    block = blocks(section("how-to/live-dashboards.md", "Live dashboards"), "bash")[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readmes_live_dashboards_commands_run_as_written(tmp_path):
    commands = live_dashboards_commands()
    assert len(commands) == 2 and all(c.startswith("python -m runner ") for c in commands)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for command in commands:
        subprocess.run(["bash", "-c", command.replace("python", sys.executable, 1)], cwd=tmp_path, env=env, check=True)
    sweep = [p.parent for p in (tmp_path / "outputs" / "multirun").rglob("manifest.json")]
    assert len(sweep) == 4
    for job in sweep:
        events = EventAccumulator(str(job / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        logged = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
        assert logged == {key: pytest.approx(np.float32(value), rel=1e-6, abs=1e-30)
                          for key, value in expected_scalars(job).items()}
    client = tracking_client(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("hook-runner").experiment_id])
    (parent,) = [r for r in runs if SWEEP_TAG in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(float(r.data.params["optimizer.lr"]) for r in children) == [0.01, 0.03, 0.1, 0.3]
    (single,) = [p.parent for p in (tmp_path / "outputs" / "runs").rglob("manifest.json")]
    (logged,) = offline_runs(single / "wandb")
    assert logged.scalars() == expected_scalars(single)
