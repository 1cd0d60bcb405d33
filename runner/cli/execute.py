"""What ``python -m runner`` does with a composed config: run it, turning failures into one line.

Exit status: 0 when every file and the manifest were written; 2 for a configuration error
(nothing written); 1 for a run that failed (output not writable, ``on_nonfinite=error``);
130 after Ctrl-C and 143 after SIGTERM (nothing written, no temporary file left). In a sweep each
job keeps its entry of ``sweep.json`` true (``running``, then how it ended, Ctrl-C included), a
failed job is recorded in its ``status.json`` too and the sweep goes on (see ``runner.cli.callbacks``).
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from common.errors import ConfigError
from runner.cli.exit_codes import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, EXIT_RUN_ERROR
from runner.cli.job_files import record_entry, write_status
from runner.cli.resume import as_recorded, kept_problem, swept
from runner.cli.signals import Terminated, in_scheduler_job, scheduler_state, sigterm_raises
from runner.cli.summary import print_summary
from runner.engine import fsdp
from runner.engine.loop import run
from runner.engine.nonfinite import NonFiniteError
from runner.engine.plan import Plan, compile_plan, describe
from runner.store.claim import claim_run_dir
from runner.store.outputs import OutputError
from common.sweep_format import FAILED, INTERRUPTED, OK, RUNNING, read_record, state_line
from runner.store.sweep_record import find_sweep, job_entry


log = logging.getLogger(__name__)


def execute(cfg: DictConfig, out_dir: str | Path, overrides: Sequence[str], multirun: bool = False,
            plan: Plan | None = None, summary: bool = True) -> None:
    """Run the experiment (``plan``, or the plan compiled from ``cfg``); report a failure as
    ``error: ...`` on stderr and exit non-zero; print the run's summary unless ``quiet`` or not ``summary``.

    With ``multirun`` the job's entry in ``sweep.json`` follows it (``running``, then how it ended),
    a failed job writes its ``status.json`` and returns, so the sweep goes on, and a job a resumed
    sweep keeps returns at once (``runner.cli.resume``).
    """
    claim = None
    if multirun:
        overrides = swept(overrides)
    try:
        with sigterm_raises():
            plan = plan or compile_plan(cfg, overrides)
            if plan.settings.plan:
                print(describe(plan))
                return
            if multirun:
                plan = as_recorded(plan)
                if _kept(plan, out_dir, overrides):
                    return
            if not plan.settings.fsdp.enabled:  # an FSDP2 run's rank 0 claims it for every rank (runner.store.ranks)
                claim = take_claim(out_dir) or claim_run_dir(out_dir, plan.settings.overwrite)
            if multirun:
                record_entry(out_dir, state=RUNNING, error=None, run_id=None if claim is None else claim.run_id)
            run(plan, out_dir, claim, group=str(Path(out_dir).resolve().parent) if multirun else None)
            if plan.settings.plots:
                from runner.analysis import plots  # matplotlib is imported only when pictures are asked for

                for path in plots.write_plots(out_dir, list(plan.settings.plots)):
                    print(f"wrote {path}")
    except (ConfigError, OutputError, NonFiniteError) as exc:
        if isinstance(exc, ConfigError) and cfg.get("plan"):
            print(_modules_only(cfg))  # the module table, to pick a selector from
        _fail(str(exc), out_dir, overrides, multirun, failure_code(exc))
        return
    except (KeyboardInterrupt, Terminated) as exc:
        signal_name = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
        if claim is not None and claim.committed:  # the manifest was in place: the run is complete
            print(f"{signal_name} after the run completed; wrote {out_dir}", file=sys.stderr)
            if not multirun:
                return
            write_status(out_dir, overrides, None)
            _say_where_the_sweep_stands(out_dir)  # and stop it: the signal was for the sweep too
        else:
            print(f"error: {signal_name}; nothing of this run was written to '{out_dir}'", file=sys.stderr)
            if multirun:
                _stopped(out_dir, overrides, f"{signal_name}; nothing of this run was written")
        if isinstance(exc, Terminated):
            raise
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if not multirun:
            raise  # a bug in the model or the runner: Hydra prints the traceback and exits 1
        log.exception("job failed")
        _fail(f"{type(exc).__name__}: {exc}", out_dir, overrides, multirun, EXIT_RUN_ERROR, scheduler_state(exc))
        return
    except SystemExit:
        if multirun and in_scheduler_job():  # submitit requeued the job (preemption, time limit) and exits
            write_status(out_dir, overrides, "requeued by the scheduler; resumes from its last complete step",
                         state="requeued")
        raise
    finally:
        if claim is not None:
            claim.release()
    if multirun:
        write_status(out_dir, overrides, None)
    if fsdp.silent_rank():
        return  # one rank of an FSDP2 run: rank 0 says what the run wrote
    print(f"wrote {out_dir}")
    if not multirun:  # a sweep's summary comes when it ends (runner.cli.callbacks)
        print_summary(out_dir, bool(cfg.get("quiet")) or not summary)


def _kept(plan: Plan, out_dir: str | Path, overrides: Sequence[str]) -> bool:
    """Whether ``sweep.json`` lists this job as kept by a resume (``ok`` or ``failed`` before it
    started); an ``ok`` job's run is checked to be this job's (``resume.kept_problem``)."""
    sweep_dir = find_sweep(out_dir)
    job = job_entry(sweep_dir, out_dir) if sweep_dir else None
    if job is None or job["state"] not in (OK, FAILED):
        return False
    if job["state"] == FAILED:
        print(f"kept {out_dir}: failed before the sweep was resumed ({job['error']}); resume=failed runs it again")
        return True
    problem = kept_problem(plan, out_dir)
    if problem:
        _fail(problem, out_dir, overrides, True, EXIT_RUN_ERROR)
    else:
        print(f"kept {out_dir}: complete before the sweep was resumed")
    return True


def _stopped(out_dir: str | Path, overrides: Sequence[str], why: str) -> None:
    """Record the job as interrupted; in the process that launched the sweep, say where the sweep
    stands and how to continue it."""
    try:
        write_status(out_dir, overrides, why, state=INTERRUPTED)
    except OSError:
        pass
    _say_where_the_sweep_stands(out_dir)


def _say_where_the_sweep_stands(out_dir: str | Path) -> None:
    """In the process that launched the sweep (the basic launcher), where it stands and how to continue it."""
    sweep_dir = find_sweep(out_dir)
    record = read_record(sweep_dir) if sweep_dir else None
    if record and record.get("pid") == os.getpid():  # the basic launcher: the sweep stops here
        print(f"error: the sweep stopped: {state_line(record['jobs'])}; continue it with the same command "
              f"and resume=true", file=sys.stderr)


_claims: dict[Path, object] = {}


def keep_claim(claim) -> None:
    """Hand the claim the run-start callback took to the run it is for (same process)."""
    _claims[Path(claim.out_dir).resolve()] = claim


def take_claim(out_dir: str | Path):
    return _claims.pop(Path(out_dir).resolve(), None)


def _modules_only(cfg: DictConfig) -> str:
    """``plan=true``'s module table for a config whose hook entries did not compile."""
    bare = OmegaConf.merge(cfg, {})
    with open_dict(bare):
        bare.hooks = {}
    try:
        return describe(compile_plan(bare))
    except ConfigError:
        return ""


def failure_code(exc: Exception) -> int:
    """The exit status for a failure the runner reports in one line."""
    return EXIT_CONFIG_ERROR if isinstance(exc, ConfigError) else EXIT_RUN_ERROR


def _fail(message: str, out_dir: str | Path, overrides: Sequence[str], multirun: bool, code: int,
          state: str | None = None) -> None:
    print(f"error: {message}", file=sys.stderr)
    if not multirun:
        sys.exit(code)
    try:
        write_status(out_dir, overrides, message, state)
    except OSError:  # the disk that failed the run (read-only, full) refuses its status too: the sweep's
        pass  # record lists the job as one that wrote no status, and the line above said why
