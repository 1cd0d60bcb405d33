"""Disk trouble in the middle of a run of a sweep, on real file systems the test mounts (root only):
an ext4 image that turns read-only under the run (``errors=remount-ro`` and ext4's own
``trigger_fs_error``, as after an I/O error: files open for writing fail with EROFS), and a small
tmpfs that fills. Either way: one line, exit status 1, no manifest, the sweep's earlier runs as
they were, and every hook gone.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
from conftest import cli, make_config
from runner.analysis.intact import PendingRunsWarning
from runner.cli.execute import execute

SMALL = ("model=convnet", "hooks=stats", "steps=2")


@pytest.fixture
def ext4(tmp_path):
    """An 8 MiB ext4 image mounted with ``errors=remount-ro``; yields it and a function that turns it read-only."""
    image, where = tmp_path / "disk.img", tmp_path / "ext4"
    where.mkdir()
    steps = [["truncate", "-s", "8M", str(image)], ["mkfs.ext4", "-q", str(image)],
             ["mount", "-o", "loop,errors=remount-ro", str(image), str(where)]]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot make an ext4 image to turn read-only ({' '.join(step[:1])}: "
                        f"{proc.stderr.strip() or proc.returncode}): a disk cannot fail under a run without it")
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(where)], capture_output=True, text=True).stdout
    knob = Path("/sys/fs/ext4") / Path(device.strip()).name / "trigger_fs_error"

    def read_only() -> None:
        knob.write_text("the disk failed under the run\n")  # ext4_error: remounted read-only at once

    try:
        if not knob.exists():
            pytest.skip(f"{knob} is missing: this kernel cannot make ext4 fail on request")
        yield where, read_only
    finally:
        subprocess.run(["umount", str(where)], check=False)


def earlier_jobs(sweep: Path, capsys) -> dict[str, bytes]:
    """Jobs 0 and 1 of ``sweep``, committed; each file's bytes."""
    for i in range(2):
        cli([*SMALL, f"seed={i}"], sweep / str(i))
    capsys.readouterr()
    return {str(p.relative_to(sweep)): p.read_bytes() for p in sorted(sweep.rglob("*")) if p.is_file()}


def assert_intact(sweep: Path, before: dict[str, bytes]) -> None:
    """Every file of jobs 0 and 1 holds what it held, and the loaders read both."""
    for name, data in before.items():
        assert (sweep / name).read_bytes() == data, name
    for i in range(2):
        stored = pq.read_metadata(sweep / str(i) / "stats.parquet").num_rows
        assert len(analysis.load_stats(sweep / str(i))) == stored > 0


def failing_at_the_second_forward(trouble):
    calls = []

    def prepare(model):
        def pre_hook(module, args):
            calls.append(1)
            if len(calls) == 2:
                trouble()
        model.register_forward_pre_hook(pre_hook)
    return prepare


def test_a_disk_turning_read_only_mid_run_is_one_line_and_leaves_the_earlier_runs(watch, ext4, capsys):
    """The temporary files cannot be removed from a read-only disk: they stay hidden, the loaders
    do not read them (the job is counted as not committed), and the next claim removes them."""
    where, read_only = ext4
    sweep = where / "sweep"
    before = earlier_jobs(sweep, capsys)
    watch.prepare = failing_at_the_second_forward(read_only)
    with pytest.raises(SystemExit) as exit_:
        cli([*SMALL, "seed=2"], sweep / "2")
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write '{sweep / '2' / 'stats.parquet'}': Read-only file system", err
    watch.assert_untouched()
    assert not [p.name for p in (sweep / "2").iterdir() if not p.name.startswith(".")]  # no manifest, no table
    assert_intact(sweep, before)
    with pytest.warns(PendingRunsWarning, match="1 job"):
        assert sorted(analysis.load_stats(sweep)["seed"].unique()) == [0, 1]


def test_a_sweep_job_whose_disk_turns_read_only_is_one_line_and_the_sweep_goes_on(watch, ext4, capsys):
    """In a sweep the failed job's status cannot be written on a read-only disk: still one line, no traceback."""
    where, read_only = ext4
    sweep = where / "sweep"
    before = earlier_jobs(sweep, capsys)
    watch.prepare = failing_at_the_second_forward(read_only)
    overrides = [*SMALL, "seed=2"]
    execute(make_config(*overrides), sweep / "2", overrides, multirun=True)  # returns: the sweep goes on
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and err.endswith("Read-only file system"), err
    assert not (sweep / "2" / "manifest.json").exists()
    watch.assert_untouched()
    assert_intact(sweep, before)
    assert not (sweep / "2" / "status.json").exists()  # it could not be written: the sweep's record says 'missing'


def test_a_disk_filling_mid_run_is_one_line_and_leaves_the_earlier_runs(fault, watch, tmpfs, capsys):
    sweep = tmpfs("size=320k") / "sweep"
    before = earlier_jobs(sweep, capsys)
    outcome = fault("hooks=extract", "hooks.extract.layers=[conv,relu]", "data.shape=[64,3,8,8]", "steps=10",
                    out=sweep / "2", forwards=None)
    assert outcome.code == 1
    assert outcome.stderr.startswith(f"error: cannot write '{sweep / '2'}/")
    assert outcome.stderr.endswith(": No space left on device")
    assert_intact(sweep, before)
