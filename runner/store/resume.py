"""A requeued run goes on from its last complete step instead of starting over.

On preemption or near its time limit, a sweep job on Slurm gets USR2; submitit's handler
requeues the job and exits with ``SystemExit``, wherever the step was. So the state after each
complete step is kept in memory (model, optimizer, RNG: a copy per step, only in a job the
scheduler can requeue), and when the run exits that way, the run directory's resume point
(``common.resume_point``: one file, written durably) receives that state and the rows the run
wrote for the complete steps (read back from its temporary parquet files). The requeued job's run finds them, restores the state, replays the
data stream to the same batch and writes the kept rows first: its final files hold the same
rows as an uninterrupted run's. The point belongs to one config (its hash); it is removed
once the run is committed.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import nn

from common.resume_point import has_resume_point, read_resume_point, remove_resume_point, write_resume_point
from runner.store.errors import OutputError


def in_scheduler_job() -> bool:
    """Whether this process is a submitit job, which the scheduler may requeue (submitit sets
    ``SUBMITIT_EXECUTOR`` in its jobs)."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


class Resume:
    """The resume point of one run in ``out_dir``: kept after each step when ``enabled``, restored when found."""

    def __init__(self, out_dir: Path, config_yaml: str, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 enabled: bool) -> None:
        self.out_dir = Path(out_dir)
        self.config_hash = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
        self.model = model
        self.optimizer = optimizer
        self.enabled = enabled
        self.first_step = 0
        self._kept: dict[str, pa.Table] = {}
        self._point: tuple[int, dict] | None = None
        self.hooks_state: dict | None = None  #: the hook session's ``run_state()`` at the resume point

    @property
    def found(self) -> bool:
        """Whether a resume point is there (``restore`` checks that it is this config's)."""
        return has_resume_point(self.out_dir)

    def restore(self, data: Iterator) -> int:
        """Load the resume point, if one of this config is there: the state, the data stream advanced
        past its steps, the rows to keep. Return the first step to run (0 without a point)."""
        point = read_resume_point(self.out_dir)
        if point is None:
            return 0
        state, kept = point
        if state.get("config_hash") != self.config_hash:
            remove_resume_point(self.out_dir)  # an earlier config's: not this run's
            return 0
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        for _ in range(state["step"]):
            next(data)
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self._kept = kept
        self.hooks_state = state["hooks"]
        self.first_step = state["step"]
        return self.first_step

    def mark(self, steps_done: int, hooks_state: dict) -> None:
        """Remember the state after ``steps_done`` complete steps (a copy; replaced in one assignment),
        with ``hooks_state``, where the hook entries' lifetimes stood (``HookSession.run_state``)."""
        if not self.enabled:
            return
        state = {"hooks": hooks_state,
                 "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                 "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
                 "rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        self._point = (steps_done, state)

    @contextlib.contextmanager
    def keeping(self, outputs) -> Iterator[None]:
        """Around the steps: the kept rows go in first; a ``SystemExit`` (submitit's requeue) saves the point."""
        for name, table in self._kept.items():
            outputs.write_rows(name, table)
        self._kept = {}
        try:
            yield
        except SystemExit:
            if self.enabled and self._point is not None:
                self._save(outputs)
            raise

    def finish(self) -> None:
        """The run is committed: its resume point is of no more use."""
        remove_resume_point(self.out_dir)

    def _save(self, outputs) -> None:
        steps, state = self._point
        try:
            tables = {name: pq.read_table(path) for name, path in outputs.flush_partial().items()}
            write_resume_point(self.out_dir, {**state, "step": steps, "config_hash": self.config_hash},
                               {name: table.filter(pc.less(table["step"], steps)) for name, table in tables.items()})
        except (OSError, OutputError):  # the previous point, whole, or none: the requeued run starts there
            pass
