"""``python -m runner replay=RUN_DIR``: a finished run runs again and its tables are compared.

The "Replay" commands of docs/how-to/replay.md run here as written (a shell would split them as ``shlex`` does);
the frames are compared by pandas here, not by the code under test. An altered copy of a run must
be named as different, with its table and column; bad run directories are one line, status 2,
nothing written.
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
import os
import re
import shlex
import shutil
import sys
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import runner
import runner.__main__ as runner_main
from runner.cli import replay
from runner.config.compose import compose_config
from runner.sources.models import build_model
from common import fingerprint
from conftest import Ran, make_config, run, run_main
from docs_text import section

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("stats.parquet", "tensors.parquet", "steps.parquet")
TIMING = ["wall_time_s", "peak_memory_bytes"]
TRAINING = ("model=digits_cnn", "data=digits", "loss=cross_entropy", "optimizer=sgd", "optimizer.lr=0.1", "steps=3",
            "eval_every=2", "hooks=stats", "progress=false")


def readme_replay_block() -> tuple[list[str], list[str]]:
    """The commands (``$ ...`` lines) and the printed lines of the Replay example (docs/how-to/replay.md)."""
    block = section("how-to/replay.md", "Replay").split("```", 2)[1].strip().splitlines()
    return [line[2:] for line in block if line.startswith("$ ")], [line for line in block if not line.startswith("$ ")]


def cli(command: str, monkeypatch, capsys, recwarn) -> Ran:
    """``command`` (``python -m runner ...``, split as a shell would) run in this process from the current
    directory; its stderr with the warnings it gave, each as the command line prints it."""
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "runner"], command
    recwarn.clear()
    ran = run_main(monkeypatch, capsys, *words[3:])
    warned = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in recwarn)
    return Ran(ran.code, ran.stdout, ran.stderr + warned)


def frame(path: Path) -> pd.DataFrame:
    """A table as pandas reads it, timing columns dropped, list cells as tuples (comparable with ==)."""
    df = pq.read_table(path).to_pandas().drop(columns=TIMING, errors="ignore")
    for column in df.columns:
        if df[column].dtype == object and len(df) and not isinstance(df[column].iloc[0], str):
            df[column] = df[column].map(lambda cell: tuple(cell.tolist()))
    return df


def assert_same_tables(a: Path, b: Path) -> None:
    for name in TABLES:
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            pd.testing.assert_frame_equal(frame(a / name), frame(b / name), check_exact=True)


def run_replay(capsys, *argv: str) -> tuple[int, str, str]:
    code = replay.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def stored_training(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stored") / "training"
    return run(make_config(*TRAINING), out, TRAINING)


@pytest.fixture
def training_run(stored_training, tmp_path) -> Path:
    """A copy of the training run for this test to change (made once per module)."""
    return Path(shutil.copytree(stored_training, tmp_path / "training"))


def replay_warnings(stderr: str) -> list[str]:
    """The warning lines of a replay, but the machine's own: without a C compiler every run says once
    that its statistics use the eager reductions (``hooks.kernels.native``), which is no difference of the replay."""
    return [line for line in stderr.splitlines() if "warning" in line.lower() and "could not be built" not in line]


def test_readme_replay_reproduces_its_run_bit_for_bit(tmp_path, monkeypatch, capsys, recwarn):
    commands, printed = readme_replay_block()
    monkeypatch.chdir(tmp_path)
    first = cli(commands[0], monkeypatch, capsys, recwarn)
    assert first.code == 0, first.stderr
    second = cli(commands[1], monkeypatch, capsys, recwarn)
    assert second.code == 0, second.stderr
    assert second.stdout.splitlines() == printed
    assert not replay_warnings(second.stderr)
    original, replayed = tmp_path / "runs/shift", tmp_path / "runs/shift-replay"
    assert_same_tables(original, replayed)
    assert len(pq.read_table(original / "tensors.parquet")) == 1  # the kept output is compared too
    assert not (tmp_path / "outputs").exists()  # replay.out given: nothing else written


def test_a_training_run_replays_bit_for_bit(tmp_path, training_run, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_replay(capsys, f"replay={training_run}")
    assert code == 0, err
    assert not replay_warnings(err)
    steps = pq.read_table(training_run / "steps.parquet").to_pandas()
    assert sorted(steps["split"]) == ["eval", "train", "train", "train"]
    assert steps.loc[steps.split == "train", "loss"].nunique() == 3  # it trained: each step's loss is new
    (replayed,) = [p.parent for p in (tmp_path / "outputs/replays").rglob("manifest.json")]  # the default dir
    assert_same_tables(training_run, replayed)
    for name in TABLES:
        assert f"{name}: equal" in out


def test_replay_runs_deterministic_with_the_runs_threads_and_restores_them(training_run, tmp_path, capsys,
                                                                            monkeypatch):
    manifest = json.loads((training_run / "manifest.json").read_text())
    threads = torch.get_num_threads() % 2 + 1  # not this process's: the replay must set it, then put ours back
    manifest["provenance"]["threads"] = threads
    (training_run / "manifest.json").write_text(json.dumps(manifest))
    seen = []
    real = replay.execute

    def execute(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()))
        return real(*args, **kwargs)

    monkeypatch.setattr(replay, "execute", execute)
    before = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(), torch.backends.cudnn.deterministic,
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    code, _, err = run_replay(capsys, f"replay={training_run}", f"replay.out={tmp_path / 'again'}")
    assert seen == [(True, threads)]
    assert (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(), torch.backends.cudnn.deterministic,
            os.environ.get("CUBLAS_WORKSPACE_CONFIG")) == before
    assert "provenance.threads" not in err  # the replay ran with the run's threads
    assert code in (0, replay.EXIT_DIFFERS), err  # (1 thread and 2 sum some gradients in another order)
    assert json.loads((tmp_path / "again/manifest.json").read_text())["provenance"]["threads"] == threads


def _altered_copy(run_dir: Path, dest: Path, name: str, column: str, row: int, value) -> Path:
    shutil.copytree(run_dir, dest)
    table = pq.read_table(dest / name)
    values = table.column(column).to_pylist()
    values[row] = value
    table = table.set_column(table.schema.get_field_index(column), table.schema.field(column),
                             pa.array(values, table.schema.field(column).type))
    pq.write_table(table, dest / name)
    return dest


@pytest.mark.parametrize(("name", "column", "row", "delta"), [
    ("stats.parquet", "l2", 1, 0.5),
    ("steps.parquet", "loss", 2, -0.25),
])
def test_an_altered_table_is_reported_with_its_table_and_column(training_run, tmp_path, capsys, name, column, row,
                                                                delta):
    stored = pq.read_table(training_run / name).column(column).to_pylist()[row]
    altered = _altered_copy(training_run, tmp_path / "altered", name, column, row, stored + delta)
    code, out, _ = run_replay(capsys, f"replay={altered}", f"replay.out={tmp_path / 'replayed'}")
    assert code == replay.EXIT_DIFFERS == 3
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if line.endswith(")") or "differs" in line}
    others = [t for t in TABLES if t != name and (training_run / t).exists()]
    assert all(lines[t].startswith(f"{t}: equal") for t in others)
    found = re.search(rf"{name}: differs: column {column}: 1 of \d+ rows, max abs difference (\S+); "
                      rf"first differing rows: row {row} \(step=", lines[name])
    assert found, lines[name]
    assert float(found.group(1)) == pytest.approx(abs(delta))


def test_a_changed_kept_tensor_is_reported(run_with, tmp_path, capsys):
    run_dir = run_with("model=linear", "hooks=[shift,extract]", "hooks.extract.layers=", "progress=false")
    values = pq.read_table(run_dir / "tensors.parquet").column("tensor_values").to_pylist()[0]
    values[3] += 0.125
    altered = _altered_copy(run_dir, tmp_path / "altered", "tensors.parquet", "tensor_values", 0, values)
    code, out, _ = run_replay(capsys, f"replay={altered}", f"replay.out={tmp_path / 'replayed'}")
    assert code == replay.EXIT_DIFFERS
    assert "tensors.parquet: differs: column tensor_values: 1 of 1 rows, max abs difference 0.125; " \
           "first differing rows: row 0 (step=0, layer=, kind=output, slot=0, call=0)" in out.splitlines()


def test_large_data_is_fingerprinted_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint, "HASH_LIMIT", 4)
    data = tmp_path / "data.bin"
    data.write_bytes(b"12345")
    first = fingerprint.describe_file(str(data))
    os.utime(data, ns=(1, 1))
    assert set(first) == {"path", "size_mtime"}
    assert fingerprint.describe_file(str(data))["size_mtime"] != first["size_mtime"]
    monkeypatch.setattr(fingerprint, "HASH_LIMIT", 5)
    assert set(fingerprint.describe_file(str(data))) == {"path", "sha256"}


def test_a_changed_checkpoint_is_one_warning_line_and_the_replay_still_runs(tmp_path, run_with, capsys,
                                                                           monkeypatch):
    model_cfg = compose_config(["model=convnet"]).model
    checkpoint = tmp_path / "convnet.pt"
    torch.manual_seed(1)
    torch.save(build_model(model_cfg).state_dict(), checkpoint)
    run_dir = run_with("model=convnet", f"model.checkpoint={checkpoint}", "hooks=stats", "progress=false")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["provenance"]["checkpoint"]["path"] == str(checkpoint)
    torch.manual_seed(2)
    torch.save(build_model(model_cfg).state_dict(), checkpoint)
    manifest["versions"]["torch"] = "0.0.1"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run_replay(capsys, f"replay={run_dir}", f"replay.out={tmp_path / 'replayed'}")
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "versions.torch: 0.0.1 -> " + metadata.version("torch") in warnings[0]
    assert "provenance.checkpoint.sha256: " in warnings[0]
    assert code == replay.EXIT_DIFFERS  # other weights, other statistics
    assert "stats.parquet: differs" in out


def test_a_data_file_is_fingerprinted(tmp_path, run_with):
    from PIL import Image

    picture = tmp_path / "cat.png"
    Image.new("RGB", (12, 12), (200, 30, 30)).save(picture)
    run_dir = run_with("model=convnet", "data=image", f"data.path={picture}", "data.resize=8", "data.crop=8",
                       "device=cpu", "progress=false")
    recorded = json.loads((run_dir / "manifest.json").read_text())["provenance"]
    assert {k: recorded[k] for k in ("seed", "threads", "device", "checkpoint")} == {
        "seed": 0, "threads": torch.get_num_threads(), "device": "cpu", "checkpoint": None}
    described = recorded["data"]
    assert described["kind"] == "image" and described["shape"] == [1, 3, 8, 8]
    assert described["path"] == {"path": str(picture),
                                 "sha256": hashlib.sha256(b"\0" + picture.read_bytes()).hexdigest()[:16]}


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: None, "replay: no directory '{d}'"),
    (lambda d: d.write_text("x"), "replay: '{d}' is a file, not a run directory"),
    (lambda d: d.mkdir(), "replay: '{d}' is not a run directory (no manifest.json)"),
    (lambda d: (d.mkdir(), (d / ".stats.parquet.tmp-123").write_text("")),
     "replay: '{d}' holds no complete run (no manifest.json: it failed, was interrupted or is still running)"),
    (lambda d: (d.mkdir(), (d / "manifest.json").write_text("{not json")), "replay: cannot read '{d}/manifest.json'"),
])
def test_a_bad_run_dir_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, make, message):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "run"
    make(target)
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run_replay(capsys, f"replay={target}")
    assert code == 2
    assert err.startswith("error: " + message.format(d=target)) and err.count("\n") == 1
    assert sorted(tmp_path.rglob("*")) == before


def test_a_run_without_config_yaml_cannot_be_replayed(training_run, capsys):
    (training_run / "config.yaml").unlink()
    code, _, err = run_replay(capsys, f"replay={training_run}")
    assert code == 2
    assert err == f"error: replay: '{training_run}' has no config.yaml (made before runs committed their config): " \
                  f"nothing to replay\n"


def test_a_run_of_a_users_own_loop_is_refused(tmp_path, capsys):
    model = torch.nn.Linear(3, 2)
    with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "own") as rec:
        loss = model(torch.ones(1, 3)).sum()
        rec.backward(loss)
        rec.step(loss)
    code, _, err = run_replay(capsys, f"replay={tmp_path / 'own'}", f"replay.out={tmp_path / 'replayed'}")
    assert code == 2
    assert err == f"error: replay: '{tmp_path / 'own'}' was recorded by runner.attach in your own loop, which the " \
                  f"runner cannot run again; only runs of python -m runner replay\n"
    assert not (tmp_path / "replayed").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["steps=5"], "replay: a replay runs the stored config as it was; only replay.out=DIR (or hydra.run.dir=DIR) "
                  "may come with it, not 'steps=5'"),
    (["replay.out=a", "hydra.run.dir=b"], "hydra.run.dir: 'b' and replay.out='a' both name where the replay writes; "
                                          "give one of them"),
    (["-m"], "not '-m'"),
    (["replay.out="], "replay.out: give a directory (replay.out=DIR)"),
])
def test_other_overrides_are_refused(training_run, capsys, tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_replay(capsys, f"replay={training_run}", *extra)
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "outputs").exists()


def test_hydras_own_run_dir_is_where_the_replay_writes(training_run, capsys, tmp_path):
    code, _, err = run_replay(capsys, f"replay={training_run}", f"hydra.run.dir={tmp_path / 'replayed'}")
    assert code == 0, err
    assert (tmp_path / "replayed" / "manifest.json").exists()
    assert_same_tables(training_run, tmp_path / "replayed")


def test_the_run_and_other_complete_runs_are_never_overwritten(training_run, tmp_path, run_with, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in training_run.iterdir()}
    code, _, err = run_replay(capsys, f"replay={training_run}", f"replay.out={training_run}")
    assert code == 2 and "replay.out: " in err and "is the run being replayed" in err
    other = run_with("model=linear", "progress=false")
    code, _, err = run_replay(capsys, f"replay={training_run}", f"replay.out={other}")
    assert code == 2 and "holds a complete run" in err, err
    assert {p.name: p.stat().st_mtime_ns for p in training_run.iterdir()} == before


def test_the_command_line_routes_a_bad_replay_before_hydra(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["runner", "replay=nowhere"])
    with pytest.raises(SystemExit) as exit_:
        runner_main.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: replay: no directory 'nowhere'\n"
    assert list(tmp_path.iterdir()) == []
