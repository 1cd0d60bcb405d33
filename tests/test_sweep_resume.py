"""A sweep stopped (Ctrl-C, SIGKILL of its launcher) says so everywhere it is read, and the same
command with ``resume=true`` finishes it: complete jobs kept, the others run, the tables those of
an uninterrupted sweep.

The state logic is tested in-process on real runs (``sweep.json`` written, updated, reconciled with
the job directories; a job kept or refused by ``execute``; a dataset pass sharded over a sweep,
stopped by Ctrl-C and resumed); the slow tests run the real CLI on
each local launcher and stop it mid-job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import open_dict

import runner.analysis as analysis
from common.errors import ConfigError
from conftest import make_config, run_main, sigint_as_at_a_terminal
from docs_text import section
from runner.analysis.report import render
from runner.analysis.sweep_jobs import NOT_STARTED, IncompleteSweepWarning
from runner.analysis.units import load_units
from runner.cli.callbacks import EarlyChecks
from runner.cli.execute import execute
from runner.cli.resume import as_recorded, carried, command_problem, difference, resume_mode, swept
from runner.config.compose import compose_with_hydra
from runner.engine import whole_pass
from runner.engine.plan import compile_plan
from runner.store.lock import DirLock
from common.job_status import STATUS
from common.sweep_format import INTERRUPTED, OK, PENDING, RUNNING, SWEEP, read_record, read_sweep, state_line
from runner.store.sweep_record import update_job, write_sweep
from sweep_checks import mid_run, tables, wait_for

ROOT = Path(__file__).resolve().parents[1]
#: The jobs of the in-process sweeps: three seeds of a one-step linear model.
BASE = ["model=linear", "hooks=clip", "steps=1"]


def entries(jobs):
    return [{"num": num, "overrides": list(overrides), "state": PENDING, "error": None, "run_dir": str(num)}
            for num, overrides in enumerate(jobs)]


@pytest.fixture
def sweep(tmp_path):
    """A sweep of three jobs (seed 0, 1, 2) whose ``sweep.json`` was written at its start, every job pending."""
    jobs = [[*BASE, f"seed={seed}"] for seed in range(3)]
    write_sweep(tmp_path, entries(jobs), command=[*BASE, "seed=0,1,2"], pid=os.getpid(), kept=[])
    return tmp_path


def job(sweep: Path, num: int, **fields) -> None:
    """Run job ``num`` of ``sweep`` in-process as a launcher does (``execute`` with ``multirun``)."""
    overrides = [*BASE, f"seed={num}", *(f"{k}={v}" for k, v in fields.items())]
    execute(make_config(*overrides), sweep / str(num), overrides, multirun=True)


def states(sweep: Path) -> list[str]:
    return [j["state"] for j in read_sweep(sweep)]


def test_each_job_updates_its_entry_as_it_runs_and_ends(sweep, capsys):
    job(sweep, 0)
    record = read_record(sweep)
    done = record["jobs"][0]
    manifest = json.loads((sweep / "0" / "manifest.json").read_text())
    assert (done["state"], done["error"], done["run_id"]) == (OK, None, manifest["run_id"])
    assert states(sweep) == [OK, PENDING, PENDING]
    assert record["states"] == {OK: 1, PENDING: 2}
    job(sweep, 1, on_nonfinite="error", loss="log_mean")  # a NaN loss: the job fails, the sweep goes on
    failed = read_sweep(sweep)[1]
    assert failed["state"] == "failed" and "the loss is nan" in failed["error"]
    assert "resume" not in manifest["overrides"] and "resume" not in " ".join(done["overrides"])


def test_a_running_entry_is_reconciled_with_its_directory(sweep):
    """A job killed outright never updated its entry: ``running`` is what its directory says."""
    job(sweep, 0)
    run_id = read_sweep(sweep)[0]["run_id"]
    update_job(sweep, sweep / "0", state=RUNNING, error=None)  # killed after its commit, before its last update
    assert states(sweep)[0] == OK
    update_job(sweep, sweep / "0", run_id="another run")  # the manifest is an earlier run's (overwrite=true)
    assert states(sweep)[0] == INTERRUPTED
    assert "ended without a word" in read_sweep(sweep)[0]["error"]
    (sweep / "1").mkdir()
    lock = DirLock.acquire(sweep / "1", time.time)  # a live process holds job 1's directory
    try:
        update_job(sweep, sweep / "1", state=RUNNING, run_id=lock.token)
        assert states(sweep)[1] == RUNNING
    finally:
        lock.release()
    assert states(sweep)[1] == INTERRUPTED  # its process is gone, nothing committed
    assert json.loads((sweep / SWEEP).read_text())["jobs"][1]["state"] == RUNNING  # reading rewrites nothing


def test_the_state_line_names_each_job_that_did_not_complete_by_number_and_swept_values(sweep):
    jobs = read_sweep(sweep)
    jobs[0]["state"], jobs[1]["state"] = OK, INTERRUPTED
    assert state_line(jobs) == "3 jobs: 1 complete, 1 interrupted (job 1: seed=1), 1 not started (job 2: seed=2)"
    assert state_line(jobs, most=0) == "3 jobs: 1 complete, 1 interrupted (; 1 more), 1 not started (; 1 more)"


def test_failed_jobs_sweep_state_the_loaders_and_the_report_name_the_jobs_that_never_ran(sweep):
    job(sweep, 0)
    (sweep / "1").mkdir()
    update_job(sweep, sweep / "1", state=RUNNING, run_id="killed")  # its process died mid-run
    state = analysis.sweep_state(sweep)
    assert state[["num", "overrides", "state"]].values.tolist() == [
        [0, "seed=0", OK], [1, "seed=1", INTERRUPTED], [2, "seed=2", PENDING]]
    assert state.loc[2, "error"] == NOT_STARTED
    failed = analysis.failed_jobs(sweep)
    assert failed["job_dir"].tolist() == [str(sweep / "1"), str(sweep / "2")]
    assert failed["error"].tolist()[1] == NOT_STARTED and failed["error"][0].startswith("interrupted: ")
    line = "3 jobs: 1 complete, 1 interrupted (job 1: seed=1), 1 not started (job 2: seed=2)"
    with pytest.warns(IncompleteSweepWarning, match=rf"^{sweep}: {line.replace('(', '[(]').replace(')', '[)]')}; "
                                                      r"reading the 1 complete run\(s\)$"):
        stats = analysis.load_stats(sweep)
    assert stats["seed"].unique().tolist() == [0]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        page = render(sweep)
    head = page.split("<h1>hook-runner report</h1>\n", 1)[1].splitlines()[0]
    assert head == f'<p class="bad">Not complete: {line}.</p>'
    assert "2 job(s) did not complete (failed, interrupted, not started) and wrote no data." in page


def test_a_sweep_none_of_whose_jobs_completed_is_one_error_naming_them(sweep):
    with pytest.raises(FileNotFoundError, match=r": 3 jobs: 3 not started \(job 0: seed=0; job 1: seed=1; job 2: seed=2\)$"):
        analysis.load_stats(sweep)


def test_a_resumed_sweep_keeps_its_complete_jobs_and_refuses_one_that_is_not_its_own(sweep, capsys):
    job(sweep, 0)
    job(sweep, 2)
    manifest = (sweep / "0" / "manifest.json").stat().st_mtime_ns
    capsys.readouterr()
    job(sweep, 0, resume="true")  # listed ok: kept, not run again
    assert capsys.readouterr().out == f"kept {sweep / '0'}: complete before the sweep was resumed\n"
    assert (sweep / "0" / "manifest.json").stat().st_mtime_ns == manifest
    (sweep / "2" / "config.yaml").write_text((sweep / "2" / "config.yaml").read_text().replace("seed: 2", "seed: 7"))
    manifest = json.loads((sweep / "2" / "manifest.json").read_text())
    manifest["config_hash"] = "0" * 16  # another config made this run
    (sweep / "2" / "manifest.json").write_text(json.dumps(manifest))
    job(sweep, 2, resume="true")
    refused = read_sweep(sweep)[2]
    assert refused["state"] == "failed"
    assert refused["error"] == (f"resume: the complete run in '{sweep / '2'}' was made with another config "
                                f"(seed: 7 -> 2); it is left as it was: rerun the sweep with overwrite=true to replace it")
    assert json.loads((sweep / "2" / "manifest.json").read_text()) == manifest  # untouched


def test_a_failed_job_a_resume_keeps_is_not_run_again(sweep, capsys):
    job(sweep, 1, on_nonfinite="error", loss="log_mean")
    status = (sweep / "1" / "status.json").read_text()
    error = read_sweep(sweep)[1]["error"]
    capsys.readouterr()
    job(sweep, 1, on_nonfinite="error", loss="log_mean", resume="true")  # listed failed by the resumed sweep's start
    assert capsys.readouterr().out == (f"kept {sweep / '1'}: failed before the sweep was resumed ({error}); "
                                       f"resume=failed runs it again\n")
    assert (sweep / "1" / "status.json").read_text() == status


def start(sweep: Path, *extra: str, base: list[str] = BASE, key: str = "seed") -> None:
    """The sweep's start (``on_multirun_start``) for ``BASE KEY=0,1,2 EXTRA``, in-process."""
    config = compose_with_hydra([*base, f"{key}=0", f"hydra.sweep.dir={sweep}", *extra])
    with open_dict(config):
        config.hydra.overrides.task = [*base, f"{key}=0,1,2", *extra]
    EarlyChecks().on_multirun_start(config)


def test_a_resumed_sweep_starts_with_its_complete_jobs_kept_and_the_others_pending(sweep):
    job(sweep, 0)
    job(sweep, 1, on_nonfinite="error", loss="log_mean")
    (sweep / "2").mkdir()
    update_job(sweep, sweep / "2", state=RUNNING, run_id="killed")
    start(sweep, "resume=true")
    record = read_record(sweep)
    assert [j["state"] for j in record["jobs"]] == [OK, "failed", PENDING]
    assert (record["kept"], record["pid"], record["command"]) == ([0, 1], os.getpid(), [*BASE, "seed=0,1,2"])
    start(sweep, "resume=failed")
    assert states(sweep) == [OK, PENDING, PENDING]


#: A dataset pass sharded over a sweep of three jobs: unit statistics of the digits (599 a shard).
SHARDED = ["model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false", "hooks=units",
           "hooks.units.layers=[conv1,fc]", "data.num_shards=3"]


def sharded_sweep(sweep: Path) -> Path:
    """``SHARDED data.shard=0,1,2`` as its start writes it, every job pending."""
    sweep.mkdir()
    jobs = [[*SHARDED, f"data.shard={shard}"] for shard in range(3)]
    write_sweep(sweep, entries(jobs), command=[*SHARDED, "data.shard=0,1,2"], pid=os.getpid(), kept=[])
    return sweep


def shard(sweep: Path, num: int, *extra: str) -> None:
    overrides = [*SHARDED, f"data.shard={num}", *extra]
    execute(make_config(*overrides), sweep / str(num), overrides, multirun=True)


def test_a_dataset_pass_sharded_over_a_sweep_merges_exactly_after_a_resume(tmp_path, monkeypatch):
    whole, stopped = sharded_sweep(tmp_path / "whole"), sharded_sweep(tmp_path / "stopped")
    for num in range(3):
        shard(whole, num)
    shard(stopped, 0)
    read = whole_pass.batches

    def ctrl_c_at_the_third_batch(*args, **kwargs):
        for i, batch in enumerate(read(*args, **kwargs)):
            if i == 2:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(whole_pass, "batches", ctrl_c_at_the_third_batch)
    with pytest.raises(SystemExit) as exit_:
        shard(stopped, 1)  # Ctrl-C two batches into shard 1's pass; shard 2 never starts
    monkeypatch.undo()
    assert exit_.value.code == 130 and states(stopped) == [OK, INTERRUPTED, PENDING]
    with pytest.warns(IncompleteSweepWarning, match="1 interrupted .job 1: data.shard=1., 1 not started"):
        pd.testing.assert_frame_equal(load_units(stopped), load_units(whole / "0"))  # shard 0 alone
    manifest = (stopped / "0" / "manifest.json").stat().st_mtime_ns
    start(stopped, "resume=true", base=SHARDED, key="data.shard")
    for num in range(3):
        shard(stopped, num, "resume=true")
    assert (stopped / "0" / "manifest.json").stat().st_mtime_ns == manifest  # kept, not run again
    assert states(stopped) == [OK] * 3
    merged = load_units(stopped)
    assert (merged["count"][merged.layer == "fc"] == 1797).all()  # every digit once
    pd.testing.assert_frame_equal(merged, load_units(whole))


#: A sweep of two one-step jobs, the second failing in its run (a NaN loss under on_nonfinite=error).
FAILING = ["model=linear", "hooks=clip", "loss=sum,log_mean", "on_nonfinite=error"]
FAILED_JOB = "model=linear hooks=clip loss=log_mean on_nonfinite=error"
NAN = "step 0: the loss is nan while every hooked tensor was finite"


def test_a_failed_job_is_named_when_the_sweep_ends_and_when_it_is_run_again(tmp_path, monkeypatch, capsys):
    """Its number, overrides, state and error, and where to read more (its status.json: the basic launcher's
    jobs print to its terminal); the command run again is refused naming it and how resume treats it."""
    sweep = tmp_path / "sweep"
    first = run_main(monkeypatch, capsys, "-m", *FAILING, f"hydra.sweep.dir={sweep}")
    job_line = f"error: job 1 ({FAILED_JOB}): failed: {NAN}"
    where = f"; its status: {sweep / '1' / STATUS}"
    *_, head, last = first.stderr.splitlines()
    assert first.code == 1 and head == "error: 1 of 2 jobs failed:"
    assert last.startswith(job_line) and last.endswith(where)
    complete = (sweep / "0" / "manifest.json").stat().st_mtime_ns
    again = run_main(monkeypatch, capsys, "-m", *FAILING, f"hydra.sweep.dir={sweep}")
    assert again.code == 2
    lines = again.stderr.splitlines()
    assert lines[0] == (f"error: overwrite: '{sweep}' already holds a sweep (1 of 2 job directories hold a complete "
                        f"run; 1 did not complete, listed below); pass resume=true to continue it (its complete jobs "
                        f"are kept; resume=failed runs its failed ones again too), overwrite=true to replace it, or "
                        f"choose another hydra.sweep.dir")
    assert len(lines) == 2 and lines[1].startswith(job_line) and lines[1].endswith(where)
    assert (sweep / "0" / "manifest.json").stat().st_mtime_ns == complete


@pytest.mark.slow
def test_a_failed_job_of_a_scheduler_is_named_with_its_log_files(tmp_path):
    """Under submitit the job's output is in the scheduler's log files, not the launcher's terminal: the
    line names them, and the error is in the one it names."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", *FAILING, *LAUNCHERS["submitit_local"],
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith(f"error: job 1 ({FAILED_JOB}): failed: {NAN}"), proc.stderr
    logs = read_sweep(sweep)[1]["logs"]
    assert last.endswith(f"; its log: {', '.join(logs)}")
    assert [Path(log).parent.parent for log in logs] == [sweep / ".submitit"] * 2
    assert NAN in Path(logs[1]).read_text()  # its stderr


def test_a_resume_is_refused_while_a_job_of_the_sweep_still_runs(sweep, capsys):
    job(sweep, 0)
    (sweep / "1").mkdir()
    lock = DirLock.acquire(sweep / "1", time.time)  # job 1's process lives on (a worker the launcher left)
    try:
        update_job(sweep, sweep / "1", state=RUNNING, run_id=lock.token)
        with pytest.raises(SystemExit) as exit_:
            start(sweep, "resume=true")
    finally:
        lock.release()
    assert exit_.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: sweep rejected before any job ran: 1 of 3 jobs are invalid"
    assert err[1].startswith(f"error: job 1 ({' '.join(BASE)} seed=1 resume=true): cannot write '{sweep / '1'}': "
                             f"a run is writing there: process {os.getpid()} on host ")
    assert [j["state"] for j in json.loads((sweep / SWEEP).read_text())["jobs"]] == [OK, RUNNING, PENDING]  # as it was


def test_a_job_run_by_a_resume_records_what_an_uninterrupted_job_records(sweep, tmp_path):
    plain = compile_plan(make_config(*BASE, "seed=1"), [*BASE, "seed=1"])
    resumed = as_recorded(compile_plan(make_config(*BASE, "seed=1", "resume=true"), [*BASE, "seed=1", "resume=true"]))
    assert (resumed.config_yaml, resumed.overrides) == (plain.config_yaml, plain.overrides)
    assert "\nresume: false\n" in plain.config_yaml


def test_resume_carries_complete_jobs_and_reruns_failed_ones_only_when_asked():
    before = [{"num": 0, "state": OK, "error": None}, {"num": 1, "state": "failed", "error": "boom"},
              {"num": 2, "state": INTERRUPTED, "error": "x"}, {"num": 3, "state": PENDING, "error": None},
              {"num": 4, "state": "cancelled", "error": "scancel"}]
    assert carried(before, "true") == {0: {"state": OK, "error": None}, 1: {"state": "failed", "error": "boom"},
                                       2: {"state": PENDING, "error": None}, 3: {"state": PENDING, "error": None},
                                       4: {"state": PENDING, "error": None}}
    assert carried(before, "failed")[1] == {"state": PENDING, "error": None}


@pytest.mark.parametrize("value, mode", [(False, None), (True, "true"), ("failed", "failed"), ("True", "true")])
def test_resume_takes_false_true_or_failed(value, mode):
    assert resume_mode({"resume": value}) == mode


def test_a_bad_resume_value_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match=r"^resume: unknown value 'faild'; valid: failed, false, true; "
                                          r"did you mean 'failed'\?$"):
        resume_mode({"resume": "faild"})


def test_a_changed_command_line_is_refused_naming_what_differs(sweep):
    now = [[*BASE, f"seed={seed}", "resume=true", f"hydra.sweep.dir={sweep}"] for seed in (0, 1, 2, 3)]
    config = compose_with_hydra(now[0])
    assert command_problem(config, now[:3], multirun=True) is None  # the sweep's own jobs
    assert command_problem(config, now, multirun=True) == (
        f"resume: this command's jobs are not the sweep's in '{sweep}' (seed: 0, 1, 2 in the sweep, 0, 1, 2, 3 now); "
        f"resume with the sweep's own command line, or run this one with overwrite=true or another hydra.sweep.dir")
    other = [["model=linear", "hooks=stats", "steps=1", f"seed={seed}"] for seed in range(3)]
    assert difference([swept(j[:4]) for j in now[:3]], other) == "hooks: clip in the sweep, stats now"
    assert "a single run has nothing to resume" in command_problem(config, now[:1], multirun=False)
    unnamed = [[*BASE, "seed=0", "resume=true"]]
    assert "name the sweep's directory, hydra.sweep.dir=DIR" in command_problem(config, unnamed, multirun=True)
    empty = sweep / "elsewhere"
    config = compose_with_hydra([*now[0][:-1], f"hydra.sweep.dir={empty}"])
    assert command_problem(config, [[*now[0][:-1], f"hydra.sweep.dir={empty}"]], multirun=True) == (
        f"resume: '{empty}' holds no sweep to resume (no sweep.json); run the sweep without resume")


# --- the real CLI, stopped mid-job on each local launcher -------------------------------------------------

#: The sweep of "Stop and resume a sweep" (docs/how-to/resume.md): six jobs of about 2 s each (300 steps of a linear
#: model), two swept keys.
COMMAND = ["model=linear", "hooks=stats", "steps=300", "optimizer=sgd,adam", "seed=range(0,3)"]
SHOWN = section("how-to/resume.md", "Stop and resume a sweep")
LAUNCHERS = {"basic": [], "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
             "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]}


def cli(sweep: Path, *extra: str, launcher: str = "basic", **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner", "-m", *COMMAND, "quiet=true", *LAUNCHERS[launcher], *extra,
                             f"hydra.sweep.dir={sweep}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=sigint_as_at_a_terminal, **popen)


def finished(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=900)
    return proc.returncode, out, "\n".join(line for line in err.splitlines() if "[HYDRA]" not in line)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("uninterrupted") / "sweep"
    code, _, err = finished(cli(sweep))
    assert code == 0, err
    return tables(sweep)


def resumed_equals(sweep: Path, uninterrupted, launcher: str, kept: list[int]) -> None:
    """The same command again is refused naming resume=true; with it, the sweep ends complete, the
    jobs ``kept`` not run again, and its tables are the uninterrupted sweep's."""
    if kept:
        code, _, err = finished(cli(sweep, launcher=launcher))
        lines = err.splitlines()
        assert code == 2 and lines[0] == (f"error: overwrite: '{sweep}' already holds a sweep ({len(kept)} of 6 job "
                                          f"directories hold a complete run; {6 - len(kept)} did not complete, listed "
                                          f"below); pass resume=true to continue it (its complete jobs are kept), "
                                          f"overwrite=true to replace it, or choose another hydra.sweep.dir"), err
        assert [line.partition(" (")[0] for line in lines[1:]] == [f"error: job {n}" for n in range(6) if n not in kept]
    manifests = {num: (sweep / str(num) / "manifest.json").stat().st_mtime_ns for num in kept}
    code, out, err = finished(cli(sweep, "resume=true", launcher=launcher))
    assert code == 0, err
    if launcher == "basic":  # the other launchers' jobs print in their own processes
        assert [line for line in out.splitlines() if line.startswith("kept ")] == [
            f"kept {sweep / str(num)}: complete before the sweep was resumed" for num in kept]
    assert {num: (sweep / str(num) / "manifest.json").stat().st_mtime_ns for num in kept} == manifests
    assert analysis.sweep_state(sweep)["state"].tolist() == [OK] * 6
    assert analysis.failed_jobs(sweep).empty
    for got, want in zip(tables(sweep), uninterrupted):
        pd.testing.assert_frame_equal(got, want)


@pytest.mark.slow
def test_ctrl_c_mid_job_stops_the_sweep_and_resume_finishes_it(tmp_path, uninterrupted):
    sweep = tmp_path / "sweep"
    proc = cli(sweep)
    wait_for(sweep, lambda jobs: jobs[2]["state"] == RUNNING and mid_run(sweep, 2))  # not a fixed sleep: under load
    proc.send_signal(signal.SIGINT)  # job 2 could end before it, and the test then saw no interrupted job
    code, _, err = finished(proc)
    assert code == 130, err
    not_run = ("3 not started (job 3: optimizer=adam seed=0; job 4: optimizer=adam seed=1; "
               "job 5: optimizer=adam seed=2)")
    line = f"6 jobs: 2 complete, 1 interrupted (job 2: optimizer=sgd seed=2), {not_run}"
    assert err.splitlines()[-2:] == [
        f"error: interrupted; nothing of this run was written to '{sweep / '2'}'",
        f"error: the sweep stopped: {line}; continue it with the same command and resume=true"]
    shown = SHOWN.split("```text\n", 1)[1].split("```", 1)[0].replace("outputs/multirun/sgd_adam", str(sweep))
    assert f"$ python -m runner -m {' '.join(COMMAND)} hydra.sweep.dir={sweep}" in shown.replace("'", "")
    assert "\n".join(err.splitlines()[-2:]) in shown  # as the docs show them
    state = analysis.sweep_state(sweep)
    assert state["state"].tolist() == [OK, OK, INTERRUPTED, PENDING, PENDING, PENDING]
    assert analysis.failed_jobs(sweep)["job_dir"].tolist() == [str(sweep / str(n)) for n in (2, 3, 4, 5)]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert f'<p class="bad">Not complete: {line}.</p>' in render(sweep)
    resumed_equals(sweep, uninterrupted, "basic", kept=[0, 1])


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_sweep_whose_launcher_is_killed_is_read_truthfully_and_resumes(tmp_path, uninterrupted, launcher):
    """SIGKILL: no handler runs, no entry is updated. A joblib worker or a submitit job is a process of
    its own that outlives its launcher and runs the job it was handed to its end (recording it), so
    that the state the test reads does not change under it, the launcher and its workers are killed
    together there, as when the machine or the allocation is lost."""
    sweep = tmp_path / "sweep"
    proc = cli(sweep, launcher=launcher)
    try:
        wait_for(sweep, lambda jobs: any(job["state"] == RUNNING and mid_run(sweep, n) for n, job in enumerate(jobs)))
        if launcher == "basic":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        jobs = wait_for(sweep, lambda jobs: all(job["state"] != RUNNING for job in jobs), timeout=5)
        states = [job["state"] for job in jobs]
        assert set(states) <= {OK, INTERRUPTED, PENDING} and states != [OK] * 6, states
        assert INTERRUPTED in states  # the jobs running died with it
        if launcher == "basic":  # one job at a time: the complete ones, the killed one, the rest never started
            assert states == [OK] * states.count(OK) + [INTERRUPTED] + [PENDING] * states.count(PENDING)
        failed = analysis.failed_jobs(sweep)
        assert failed["job_dir"].tolist() == [str(sweep / str(n)) for n, s in enumerate(states) if s != OK]
        assert (failed["error"] == NOT_STARTED).sum() == states.count(PENDING)
        resumed_equals(sweep, uninterrupted, launcher, kept=[n for n, s in enumerate(states) if s == OK])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the workers the killed launcher left
        except ProcessLookupError:
            pass
