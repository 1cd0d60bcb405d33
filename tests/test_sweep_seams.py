"""Sweeps as they really are: jobs still writing, one job's file truncated or its manifest corrupt.

The loaders read only committed runs, whole, and say in one line what they did not read
(``runner.analysis.intact``); the frames are compared with a plain pyarrow read of the runs read.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import runner.analysis as analysis
from common.errors import ConfigError
from conftest import make_config, run
from runner.analysis.intact import CorruptRunError, PendingRunsWarning, SkippedRunsWarning
from runner.analysis.report import main as report_main, render
from runner.analysis.summary import summarize

OVERRIDES = ["model=mlp", "hooks=stats", "steps=2"]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Three committed jobs, copied from one real run, each with its own override."""
    root = tmp_path_factory.mktemp("seams")
    run(make_config(*OVERRIDES), root / "run", OVERRIDES)
    manifest = json.loads((root / "run" / "manifest.json").read_text())
    for i in range(3):
        job = root / "sweep" / str(i)
        shutil.copytree(root / "run", job)
        (job / "manifest.json").write_text(json.dumps({**manifest, "overrides": [f"seed={i}"]}))
    return root / "sweep"


@pytest.fixture
def sweep(template, tmp_path):
    shutil.copytree(template, tmp_path / "sweep")
    return tmp_path / "sweep"


def expected_stats(*jobs) -> pa.Table:
    return pa.concat_tables([pq.read_table(job / "stats.parquet") for job in jobs])


def only(record, category):
    found = [w for w in record if issubclass(w.category, category)]
    assert len(found) == 1, [str(w.message) for w in record]
    message = str(found[0].message)
    assert "\n" not in message
    return message


def test_jobs_still_writing_are_not_read_and_one_line_says_how_many(sweep):
    for i, leftover in ((3, ".stats.parquet.tmp-1234"), (4, ".runner.lock")):  # claimed, mid-write
        job = sweep / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / leftover).write_bytes(b"PAR1 half a row group")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        stats = analysis.load_stats(sweep)
    message = only(record, PendingRunsWarning)
    assert message.startswith(f"{sweep}: 2 job(s) have not committed yet")
    assert message.endswith("reading the 3 complete run(s)")
    assert sorted(stats["seed"].unique()) == [0, 1, 2]
    assert len(stats) == expected_stats(*(sweep / str(i) for i in range(3))).num_rows
    with pytest.warns(PendingRunsWarning):  # the report's summary reads the same runs
        assert summarize(sweep).splitlines()[0] == f"sweep {sweep}: 3 complete job(s)"


def test_a_failed_job_is_not_pending(sweep):
    failed = sweep / "3"
    (failed / ".hydra").mkdir(parents=True)
    (failed / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(analysis.load_steps(sweep)) == len(pq.read_table(sweep / "0" / "steps.parquet")) * 3


def named_or_skipped(sweep: Path, named: Path):
    """``load_stats(sweep)``: one error line naming the damaged file ``named``; with
    ``on_corrupt="skip"``, one warning naming it, and the frame of the other runs, returned."""
    with pytest.raises(CorruptRunError) as error:
        analysis.load_stats(sweep)
    message = str(error.value)
    assert message.startswith(f"{named}: ") and "\n" not in message
    assert message.endswith("to read the other runs: on_corrupt='skip'")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        stats = analysis.load_stats(sweep, on_corrupt="skip")
    assert only(record, SkippedRunsWarning).startswith(f"skipped 1 damaged run(s): {named}: ")
    return stats


@pytest.mark.parametrize("damage, named", [
    ("truncate", "stats.parquet"), ("manifest", "manifest.json"), ("missing", "stats.parquet")])
def test_a_damaged_run_is_one_error_naming_the_file_or_skipped_on_request(sweep, damage, named):
    broken = sweep / "1"
    if damage == "truncate":
        data = (broken / "stats.parquet").read_bytes()
        (broken / "stats.parquet").write_bytes(data[:len(data) // 2])
    elif damage == "manifest":
        (broken / "manifest.json").write_text('{"complete": true, "files": {"stats.par')
    else:
        (broken / "stats.parquet").unlink()
    stats = named_or_skipped(sweep, broken / named)
    with pytest.warns(SkippedRunsWarning):
        steps = analysis.load_steps(sweep, on_corrupt="skip")  # the run is left out of every table
    assert sorted(stats["seed"].unique()) == sorted(steps["seed"].unique()) == [0, 2]
    assert len(stats) == expected_stats(sweep / "0", sweep / "2").num_rows
    assert stats["l2"].tolist() == expected_stats(sweep / "0", sweep / "2")["l2"].to_pylist()


def as_two_ranks(job: Path) -> None:
    """``job`` made a run of two ranks as ``runner.store.ranks`` commits one: its files in ``rank-0``
    and ``rank-1`` (the same rows twice), each part with its own manifest, the run's listing them."""
    manifest = json.loads((job / "manifest.json").read_text())
    for rank in (0, 1):
        part = job / f"rank-{rank}"
        part.mkdir()
        for name in manifest["files"]:
            shutil.copy(job / name, part / name)
        (part / "manifest.json").write_text(json.dumps({**manifest, "rank": rank, "world_size": 2}))
    for name in manifest["files"]:
        (job / name).unlink()
    (job / "manifest.json").write_text(json.dumps({**manifest, "files": {}, "ranks": {"0": "rank-0", "1": "rank-1"}}))


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_ranks_part_is_one_error_naming_its_manifest_or_skipped_on_request(sweep, damage):
    as_two_ranks(sweep / "1")
    stats = analysis.load_stats(sweep)
    rows = pq.read_metadata(sweep / "0" / "stats.parquet").num_rows
    assert stats.loc[stats["seed"] == 1, "rank"].value_counts().to_dict() == {0: rows, 1: rows}  # both parts read
    named = sweep / "1" / "rank-1" / "manifest.json"
    if damage == "corrupt":
        named.write_text('{"complete": true, "files": {"stats.par')
    else:
        named.unlink()
    stats = named_or_skipped(sweep, named)
    assert sorted(stats["seed"].unique()) == [0, 2]
    assert stats["l2"].tolist() == expected_stats(sweep / "0", sweep / "2")["l2"].to_pylist()


def test_the_report_names_a_damaged_file_in_one_line(sweep, capsys):
    (sweep / "2" / "manifest.json").write_text("not json")
    with pytest.raises(SystemExit) as exit_:
        report_main([str(sweep)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {sweep / '2' / 'manifest.json'}: not a JSON manifest") and err.count("\n") == 1
    assert not (sweep / "report.html").exists()


def test_the_report_skips_damaged_runs_on_request_with_one_warning_line(sweep, capsys):
    """A truncated parquet file in one job and a corrupt manifest in another: ``--on-corrupt skip``
    writes the page over the others, and says once, in one line, which files it left out."""
    shutil.copytree(sweep / "0", sweep / "3")
    data = (sweep / "1" / "stats.parquet").read_bytes()
    (sweep / "1" / "stats.parquet").write_bytes(data[:len(data) // 2])
    (sweep / "2" / "manifest.json").write_text("not json")
    report_main([str(sweep), "--on-corrupt", "skip"])
    out, err = capsys.readouterr()
    assert out == f"{sweep / 'report.html'}\n"
    assert err.startswith(f"warning: skipped 2 damaged run(s): {sweep / '1' / 'stats.parquet'}: ") and err.count("\n") == 1
    assert f"; {sweep / '2' / 'manifest.json'}: not a JSON manifest" in err
    rows = expected_stats(sweep / "0", sweep / "3").num_rows
    assert f": 2 run(s), {rows} statistic rows;" in (sweep / "report.html").read_text()
    with warnings.catch_warnings(record=True) as record:  # the same through the Python API: one warning
        warnings.simplefilter("always")
        page = render(sweep, on_corrupt="skip")
    assert only(record, SkippedRunsWarning).startswith("skipped 2 damaged run(s): ")
    assert f": 2 run(s), {rows} statistic rows;" in page


def test_on_corrupt_takes_error_or_skip(sweep):
    with pytest.raises(ConfigError,
                       match=r"^on_corrupt: unknown policy 'skp'; valid: error, skip; did you mean 'skip'\?$"):
        analysis.load_stats(sweep, on_corrupt="skp")


def test_a_run_of_an_older_schema_loads_beside_a_new_one_with_its_missing_columns_empty(sweep):
    """A job written before ``peak_memory_bytes`` existed: its rows hold NaN there, the others their values."""
    old = sweep / "0" / "steps.parquet"
    pq.write_table(pq.read_table(old).drop_columns(["peak_memory_bytes"]), old)
    steps = analysis.load_steps(sweep)
    new = pa.concat_tables([pq.read_table(sweep / str(i) / "steps.parquet") for i in (1, 2)])
    assert steps.loc[steps["seed"] == 0, "peak_memory_bytes"].isna().all()
    assert steps.loc[steps["seed"] != 0, "peak_memory_bytes"].tolist() == new["peak_memory_bytes"].to_pylist()


#: What ``test_ten_thousand_jobs_load_within_the_frame`` runs in a fresh process, after a first
#: small load (its imports are not the sweep's): the memory the load allocated at its peak (Python
#: and numpy, traced, plus pyarrow's pool), what is still allocated once the frame is dropped,
#: the frame's own size, and the RSS high-water mark the load added (allocators keep freed pages).
_MEASURE = """
import gc, sys, tracemalloc
import pyarrow as pa
import runner.analysis as analysis

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

analysis.load_stats(sys.argv[2])
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM
base = status("VmRSS")
tracemalloc.start()
df = analysis.load_stats(sys.argv[1])
frame, rows, runs = int(df.memory_usage(deep=True).sum()), len(df), df["run_dir"].nunique()
peak = tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory()
del df
gc.collect()
print(rows, runs, peak, tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes(), frame, status("VmHWM") - base)
"""


def measure_load(sweep: Path, warm: Path) -> tuple[int, int, int, int, int, int]:
    """``_MEASURE`` of loading ``sweep`` in a fresh process (after loading ``warm``): rows, runs, bytes
    allocated at the peak, bytes left once the frame is dropped, the frame's bytes, RSS high-water added."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(sweep), str(warm)], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return tuple(map(int, proc.stdout.split()))


def write_jobs(template: Path, out: Path, jobs: int, names=("stats.parquet",)) -> Path:
    """``jobs`` copies of ``template``'s files ``names`` under ``out``, each with its own overrides."""
    files = {name: (template / name).read_bytes() for name in names}
    manifest = json.loads((template / "manifest.json").read_text())
    manifest["files"] = {name: entry for name, entry in manifest["files"].items() if name in names}
    for i in range(jobs):
        job = out / str(i)
        job.mkdir(parents=True)
        for name, data in files.items():
            (job / name).write_bytes(data)
        (job / "manifest.json").write_text(json.dumps({**manifest, "overrides": [f"seed={i}", f"lr={10 ** -(i % 4)}"]}))
    return out


def test_two_thousand_jobs_load_within_twice_the_frame(template, tmp_path):
    """A sweep of many tiny jobs: at its peak the load holds under twice the frame (the frame
    included: each job's path, overrides and file beside its rows, and the group of rows being
    converted; measured 1.66), and under 1 MiB once the frame is dropped. Before the loaders kept
    a compact record per job, not its manifest, and converted 1,024 rows at a time, not 16,384: 5.5 times."""
    sweep = write_jobs(template / "0", tmp_path / "sweep", 2_000)
    rows, runs, peak, left, frame, _ = measure_load(sweep, template / "0")
    assert rows == 2_000 * pq.read_metadata(template / "0" / "stats.parquet").num_rows and runs == 2_000
    assert peak <= 2 * frame, (peak / frame, peak, frame)
    assert left <= 1 << 20, left


@pytest.mark.soak
def test_ten_thousand_jobs_load_within_the_frame(template, tmp_path):
    """10,000 jobs: every row is read; at its peak the load holds at most twice the frame, and
    nothing once the frame is dropped."""
    big = write_jobs(template / "0", tmp_path / "big", 10_000, ("stats.parquet", "steps.parquet", "config.yaml"))
    rows, runs, peak, left, frame, rss = measure_load(big, template / "0")
    assert rows == 10_000 * pq.read_metadata(template / "0" / "stats.parquet").num_rows and runs == 10_000
    print(f"10,000 jobs: frame {frame / 2**20:.1f} MiB; allocated at the peak {peak / 2**20:.1f} MiB "
          f"({peak / frame:.2f} times), after {left / 2**20:.1f} MiB; RSS high-water added {rss / 2**20:.1f} MiB")
    assert peak <= 2 * frame, (peak / frame, peak, frame)
    assert left <= 4 << 20, left
