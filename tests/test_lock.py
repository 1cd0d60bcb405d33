"""The run-directory claim (``.runner.lock``) and the checks before a run: who holds a directory,
when a claim is stale (same host: dead or reused PID; other host: no heartbeat on the file
system's clock), full and read-only disks refused with nothing left."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import ConfigError
import runner.store.lock as lock
from runner.store.claim import MIN_FREE_BYTES, check_output_dir, claim_run_dir
from runner.store.errors import OutputError
from common.claim_record import STALE_AFTER_S, machine, process_start
from common.records import LOCK

ROOT = Path(__file__).resolve().parents[1]


def listing(path: Path) -> dict[str, int]:
    """Every file under ``path`` with its mtime: what "nothing changed" compares."""
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


def foreign_claim(out: Path, **record) -> Path:
    """A claim written by someone else: this machine's identity unless ``record`` says otherwise."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    path.write_text(json.dumps({**machine(), "pid_start": None, "started": "2026-01-01T00:00:00+00:00",
                                "token": "theirs", **record}))
    return path


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look untouched for ``seconds`` (on the file system's clock)."""
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


def test_a_claim_names_its_owner_and_release_removes_it(tmp_path):
    out = tmp_path / "new" / "run"
    with claim_run_dir(out, overwrite=False) as claim:
        record = json.loads((out / LOCK).read_text())
        assert (record["host"], record["pid"], record["token"]) == (socket.gethostname(), os.getpid(), claim.run_id)
        assert not claim.committed
    assert list(out.iterdir()) == []


def test_a_live_claim_on_this_host_is_refused_before_anything_is_created(tmp_path):
    out = tmp_path / "run"
    live = os.getppid()
    foreign_claim(out, pid=live, pid_start=process_start(live))
    before = listing(out)
    for check in (lambda: check_output_dir(out, overwrite=True), lambda: claim_run_dir(out, overwrite=True)):
        with pytest.raises(OutputError) as info:
            check()
        assert str(info.value).startswith(
            f"cannot write '{out}': a run is writing there: process {live} on host '{socket.gethostname()}' "
            f"(since 2026-01-01T00:00:00+00:00, .runner.lock); wait for it or choose another directory")
        assert listing(out) == before


def zombie() -> subprocess.Popen:
    """A child that has exited but is not reaped yet: its PID still answers ``kill(pid, 0)``."""
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    return proc


@pytest.mark.parametrize("owner", ["dead PID", "reused PID", "zombie"])
def test_a_claim_whose_process_is_gone_is_taken_over(tmp_path, owner):
    out = tmp_path / "run"
    child = zombie() if owner == "zombie" else None
    record = {"dead PID": {"pid": dead_pid()}, "reused PID": {"pid": os.getppid(), "pid_start": 1},
              "zombie": {"pid": child and child.pid}}[owner]
    foreign_claim(out, **record)
    (out / ".stats.parquet.tmp-1").write_bytes(b"PAR1")  # what the dead run was writing
    (out / ".runner-probe-1-0badcafe").write_bytes(b"")  # its probe, interrupted before its clean-up
    with claim_run_dir(out, overwrite=False) as claim:
        assert json.loads((out / LOCK).read_text())["token"] == claim.run_id
        assert sorted(p.name for p in out.iterdir()) == [LOCK]
    if child:
        child.wait()


def test_a_claim_from_another_host_is_live_until_its_heartbeat_is_old(tmp_path):
    out = tmp_path / "run"
    path = foreign_claim(out, host="node-07", boot_id="other", pid=os.getpid())  # that PID means nothing here
    with pytest.raises(OutputError, match="process .* on host 'node-07'"):
        claim_run_dir(out, overwrite=False)
    age(path, STALE_AFTER_S - 30)
    with pytest.raises(OutputError, match="on host 'node-07'"):
        claim_run_dir(out, overwrite=False)
    age(path, 60)
    claim_run_dir(out, overwrite=False).release()
    assert not path.exists()


def test_an_unreadable_claim_is_judged_by_its_age(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_bytes(b"")  # created, its owner died before writing it
    with pytest.raises(OutputError, match=r"an unreadable claim \(\.runner\.lock\)"):
        claim_run_dir(out, overwrite=False)
    age(out / LOCK, STALE_AFTER_S + 1)
    claim_run_dir(out, overwrite=False).release()


def test_the_heartbeat_keeps_a_claim_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.01)
    with claim_run_dir(tmp_path / "run", overwrite=False):
        path = tmp_path / "run" / LOCK
        age(path, 10 * STALE_AFTER_S)
        stale = path.stat().st_mtime
        deadline = time.monotonic() + 30
        while path.stat().st_mtime == stale and time.monotonic() < deadline:
            time.sleep(0.01)
        assert path.stat().st_mtime > stale + 9 * STALE_AFTER_S


def test_a_claim_replaced_while_being_taken_over_is_put_back(tmp_path, monkeypatch):
    """Two runs judge the same stale claim: the one whose rename moves the other's new claim
    puts it back and is refused, so only one of them holds the directory."""
    out = tmp_path / "run"
    path = foreign_claim(out, pid=dead_pid())
    rename = os.rename

    def other_run_first(src, dst):
        if Path(src) == path:
            foreign_claim(out, pid=os.getppid(), token="winner")  # the other contender got there first
        rename(src, dst)

    monkeypatch.setattr(os, "rename", other_run_first)
    with pytest.raises(OutputError, match=f"process {os.getppid()}"):
        claim_run_dir(out, overwrite=False)
    assert json.loads(path.read_text())["token"] == "winner"
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_a_run_that_lost_its_claim_commits_nothing(tmp_path):
    from runner.store.outputs import RunOutputs

    out = tmp_path / "run"
    with pytest.raises(OutputError, match="this run lost its claim of the directory .*node-07"):
        with RunOutputs(out, "x"):
            foreign_claim(out, host="node-07", boot_id="other", pid=1)  # taken over after missed heartbeats
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # theirs, untouched
    (out / LOCK).unlink()
    with pytest.raises(OutputError, match=f"now held by no one: {LOCK} was removed"):
        with RunOutputs(out, "x"):
            (out / LOCK).unlink()
    assert list(out.iterdir()) == []


def test_an_interrupt_while_the_claim_is_written_leaves_no_claim_and_no_directory(tmp_path, monkeypatch):
    def interrupted(fd, data):
        raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, "write", interrupted)
        claim_run_dir(tmp_path / "new" / "run", overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_a_complete_run_is_refused_without_overwrite_before_anything_is_created(tmp_path):
    from runner.store.outputs import RunOutputs

    out = tmp_path / "run"
    with RunOutputs(out, "x"):
        pass
    before = listing(out)
    with pytest.raises(ConfigError, match="already holds a complete run"):
        claim_run_dir(out, overwrite=False)
    assert listing(out) == before
    claim_run_dir(out, overwrite=True).release()


def test_a_second_process_is_refused_while_the_first_lives_and_takes_over_after_it_is_killed(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from runner.store.claim import claim_run_dir; "
                               "claim_run_dir(sys.argv[1], False); print('claimed', flush=True); sys.stdin.read()",
         str(out)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "claimed\n"
        with pytest.raises(OutputError, match=f"process {holder.pid} on host '{socket.gethostname()}'"):
            claim_run_dir(out, overwrite=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    claim_run_dir(out, overwrite=False).release()


# --- full and read-only file systems -------------------------------------------------------------

def fill(where: Path) -> None:
    with open(where / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError) as info:
            while True:
                f.write(bytes(4096))
    assert info.value.errno == errno.ENOSPC


def test_a_full_disk_is_refused_before_the_run_and_nothing_is_left(tmpfs):
    full = tmpfs("size=64k")
    fill(full)
    for out in (full / "new" / "run", full):
        with pytest.raises(OutputError) as info:
            claim_run_dir(out, overwrite=False)
        assert str(info.value) == f"cannot write '{out}': No space left on device"
        assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_too_little_free_space_is_refused_before_the_run(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=MIN_FREE_BYTES - 1))
    with pytest.raises(OutputError, match=f"cannot write '{tmp_path}/run': No space left on device "
                                          f"\\({MIN_FREE_BYTES - 1} bytes free, a run needs at least"):
        claim_run_dir(tmp_path / "run", overwrite=False)
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_file_system_is_refused_before_the_run(tmpfs):
    ro = tmpfs("ro,size=64k")
    with pytest.raises(OutputError, match=f"cannot write '{ro}/run': '{ro}' is not a writable directory"):
        claim_run_dir(ro / "run", overwrite=False)
