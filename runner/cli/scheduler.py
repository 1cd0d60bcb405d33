"""What the scheduler says, as the runner's one line: sbatch's refusals and jobs stuck in the queue.

Pure functions over Slurm's text, so the rules are tested without a cluster; ``hydra_plugins.runner_slurm``
feeds them sbatch's stderr and ``squeue``'s rows.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from runner.config.slurm import UNSCHEDULABLE

#: sbatch's words -> the launcher keys that decide them (first match wins).
_SBATCH_KEYS = (
    ("partition", ("partition",)),
    ("generic resource", ("gpus_per_node", "gres")),
    ("gres", ("gpus_per_node", "gres")),
    ("account", ("account",)),
    ("qos", ("qos",)),
    ("time limit", ("timeout_min",)),
    ("memory", ("mem_gb",)),
    ("processors", ("cpus_per_task",)),
    ("cpu count", ("cpus_per_task",)),
    ("constraint", ("constraint",)),
    ("node configuration", ("cpus_per_task", "mem_gb", "gpus_per_node")),
)


#: Slurm's final states of a job that produced no result -> the run state ``status.json`` records.
RUN_STATES = {"CANCELLED": "cancelled", "TIMEOUT": "timeout", "DEADLINE": "timeout", "PREEMPTED": "cancelled"}


def sbatch_error(stderr: str, params: Mapping[str, object]) -> str:
    """sbatch's refusal as one line naming the launcher key (or keys) that decide it."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln.removeprefix("sbatch: error: ") for ln in lines if ln.startswith("sbatch: error:")]
    reason = "; ".join(e for e in errors if not e.startswith("Batch job submission failed")) or \
        (errors[-1].removeprefix("Batch job submission failed: ") if errors else (lines[-1] if lines else stderr))
    lowered = " ".join(errors).lower() or reason.lower()
    keys = next((keys for word, keys in _SBATCH_KEYS if word in lowered), ())
    if not keys:
        return f"hydra.launcher: sbatch refused the jobs: {reason}"
    values = ", ".join(f"{key}={params.get(key)!r}" for key in keys)
    return f"hydra.launcher.{keys[0]}: sbatch refused the jobs: {reason} ({values}; sinfo shows what the cluster has)"


def parse_squeue(text: str) -> dict[str, tuple[str, str]]:
    """``squeue -h -o '%i|%T|%r'`` rows -> ``{job id: (state, reason)}``."""
    rows = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            rows[parts[0]] = (parts[1], parts[2])
    return rows


class PendingWatch:
    """Tells when a sweep cannot be scheduled: none of its jobs ever started and all have been
    PENDING for an unschedulable reason for ``limit_s`` seconds (``None``: never)."""

    def __init__(self, limit_s: float | None, reasons: Sequence[str] = UNSCHEDULABLE) -> None:
        self.limit_s = limit_s
        self.reasons = tuple(reasons)
        self.started = False
        self.since: float | None = None

    def stuck(self, rows: Mapping[str, tuple[str, str]], now: float) -> str | None:
        """The reason the sweep is stuck at ``now``, or ``None`` while it may still run."""
        if self.limit_s is None or self.started or not rows:
            return None
        if any(state != "PENDING" for state, _ in rows.values()):
            self.started = True
            return None
        reasons = sorted({reason for _, reason in rows.values()})
        if not all(any(r.startswith(u) for u in self.reasons) for r in reasons):
            self.since = None
            return None
        self.since = now if self.since is None else self.since
        if now - self.since < self.limit_s:
            return None
        return ", ".join(reasons)


def stuck_error(reason: str, waited_s: float, params: Mapping[str, object]) -> str:
    asked = ", ".join(f"{k}={params.get(k)!r}" for k in ("partition", "cpus_per_task", "mem_gb", "gpus_per_node",
                                                          "timeout_min") if params.get(k) is not None)
    return (f"hydra.launcher: no job of the sweep could be scheduled: PENDING ({reason}) for {waited_s:.0f} s; "
            f"the request ({asked}) fits no node of the partition (sinfo -N -l shows them); the jobs were cancelled. "
            f"Lower the request, or raise hydra.launcher.unschedulable_after_s")


def run_state(slurm_state: str) -> str:
    """The run state of a job Slurm ended without a result (``CANCELLED by 0`` -> ``cancelled``)."""
    return RUN_STATES.get(slurm_state.split()[0] if slurm_state else "", "failed")


def trace_error(message: str) -> str:
    """The exception line of submitit's ``FailedJobError`` (its traceback sits between two dashed lines)."""
    lines = message.splitlines()
    dashes = [i for i, line in enumerate(lines) if line.strip() and not line.strip("-")]
    trace = lines[dashes[0] + 1:dashes[1]] if len(dashes) >= 2 else lines
    found = [line.strip() for line in trace if line.strip()]
    return found[-1] if found else message.strip()
