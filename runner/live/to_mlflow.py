"""``logger=mlflow``: an MLflow run on a tracking server or a local store; a sweep's jobs are children of one parent run.

MLflow names may hold only letters, digits, ``_ - . / `` and spaces: ``metric_key`` turns the
tags' other characters (``(model)``, ``relu #1``, ``split[1]``) into ``_``. MLflow has no
histograms. The config goes to the run's params (dotted keys), the overrides to param ``overrides``.
"""
from __future__ import annotations

import fcntl
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from runner.config.registry import LOGGERS
from runner.live.config import LoggerConfig
from runner.live.lines import LogLine
from runner.live.loggers import RunContext

#: What one ``log_batch`` call may carry (MLflow's limits).
MAX_METRICS, MAX_PARAMS, MAX_PARAM_LENGTH = 1000, 100, 6000
#: The tag naming a sweep's directory on its parent run (how its jobs find it).
SWEEP_TAG = "hook_runner.sweep"
#: The lock file, in the sweep's directory, under which the first job makes the parent run.
PARENT_LOCK = ".mlflow-parent.lock"
_BAD = re.compile(r"[^/\w.\- ]")


def metric_key(tag: str) -> str:
    """``tag`` as an MLflow metric name: ``train/stats/(model) #1/output/std`` -> ``train/stats/_model_ _1/output/std``."""
    return _BAD.sub("_", tag)


@dataclass
class MLflowLogger(LoggerConfig):
    tracking_uri: Optional[str] = None  #: null: ``MLFLOW_TRACKING_URI``, else MLflow's default local store
    experiment: str = "hook-runner"  #: the MLflow experiment the runs go in

    def server(self) -> str | None:
        """The tracking server's URL: ``tracking_uri`` (else ``MLFLOW_TRACKING_URI``) when it is ``http(s)://``."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        return uri if uri.startswith(("http://", "https://")) else None


@LOGGERS.register("mlflow", schema=MLflowLogger)
class MLflowSink:
    """One MLflow run (``run_id``) logged with ``MlflowClient.log_batch``, one call per step."""

    library = "mlflow"

    def __init__(self, cfg: MLflowLogger, context: RunContext, client=None, run_id: str | None = None) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self.metric, self.owned = Metric, run_id is None
        self.client = client or MlflowClient(cfg.tracking_uri)
        if run_id is None:
            experiment = _experiment(self.client, cfg.experiment)
            tags = {"mlflow.parentRunId": _parent_run(self.client, experiment, context.group)} if context.group else {}
            run_id = self.client.create_run(experiment, run_name=context.name, tags=tags).info.run_id
            params = [Param(metric_key(key), str(value)[:MAX_PARAM_LENGTH]) for key, value in _flat(context.config)]
            params.append(Param("overrides", " ".join(context.overrides)[:MAX_PARAM_LENGTH]))
            for i in range(0, len(params), MAX_PARAMS):
                self.client.log_batch(run_id, params=params[i:i + MAX_PARAMS])
        self.run_id = run_id

    @classmethod
    def adopt(cls, client, run_id: str) -> MLflowSink:
        """A sink logging into an open MLflow run (a trainer's own; not ended at the end)."""
        return cls(MLflowLogger(), RunContext(Path(".")), client, run_id)

    def log(self, line: LogLine) -> None:
        now = int(time.time() * 1000)
        metrics = [self.metric(metric_key(tag), value, now, line.step) for tag, value in line.scalars.items()]
        for i in range(0, len(metrics), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS], synchronous=True)

    def close(self, failed: bool) -> None:
        if self.owned:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _experiment(client, name: str) -> str:
    """The id of experiment ``name``, made by the first job that needs it (another job may make it meanwhile)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except Exception:  # noqa: BLE001 - made by another job since: take that one
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    return found.experiment_id


def _parent_run(client, experiment: str, sweep: str) -> str:
    """The parent run of the sweep in directory ``sweep``: found by its tag, or made (and ended: the
    children carry the run) by the first job, under a lock file in the sweep's directory."""
    with open(Path(sweep) / PARENT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        quoted = sweep.replace("'", "\\'")
        found = client.search_runs([experiment], filter_string=f"tags.`{SWEEP_TAG}` = '{quoted}'", max_results=1)
        if found:
            return found[0].info.run_id
        parent = client.create_run(experiment, run_name=f"sweep {Path(sweep).name}", tags={SWEEP_TAG: sweep})
        client.set_terminated(parent.info.run_id, "FINISHED")
        return parent.info.run_id


def _flat(config: dict, prefix: str = ""):
    """``(dotted.key, value)`` of every leaf of a nested config."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
