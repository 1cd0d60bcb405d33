"""The run directory's small formats on the bottom floor, once: ``status.json`` (``common.job_status``),
``config.yaml`` (``common.run_config``) and the resume point (``common.resume_point``) each have one
reader and one writer, in common/, and are written through the durable write (``common.durable``).

Found in the tree with ``ast``: only common/ spells a format's file name, and only its own module
reads or writes a file by it; and a write killed at its rename leaves the previous file whole.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from common import job_status, resume_point, run_config
from common.records import CONFIG
from runner.analysis import load

ROOT = Path(__file__).resolve().parents[1]
#: Each format: its file name, the constants that name it, and the one module that reads and writes it.
FORMATS = {
    "status.json": ({"STATUS"}, "common/job_status.py"),
    "config.yaml": ({"CONFIG", "HYDRA_CONFIG"}, "common/run_config.py"),
    ".resume": ({"RESUME"}, "common/resume_point.py"),
}
#: Calls that read or write a file (``path.read_text()``, ``open(path)``, ``OmegaConf.load(path)``, ...).
IO_CALLS = {"read_text", "write_text", "read_bytes", "write_bytes", "open", "load", "loads", "save", "unlink",
            "rmtree", "read_table", "write_table", "rename", "replace"}


#: The room reading other tools' folders (SAELens, circuit-tracer), whose files' names may be a run's too
#: (circuit-tracer's transcoder folder holds a ``config.yaml`` of its own): no run file is read there.
OTHER_TOOLS_FORMATS = "hooks/formats/"


@functools.cache
def _sources() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text())
            for package in ("common", "hooks", "runner", "hydra_plugins") for path in (ROOT / package).rglob("*.py")
            if not str(path.relative_to(ROOT)).startswith(OTHER_TOOLS_FORMATS)}


def _docstrings(tree: ast.Module) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _names_the_file(value: object, name: str) -> bool:
    return isinstance(value, str) and (value == name or value.endswith(f"/{name}"))


@pytest.mark.parametrize("name", FORMATS)
def test_only_the_bottom_floor_spells_the_file_name(name):
    spelled = sorted((path, node.lineno) for path, tree in _sources().items() if (docs := _docstrings(tree)) is not None
                     for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docs
                     and _names_the_file(node.value, name))
    assert spelled and all(path.startswith("common/") for path, _ in spelled), spelled


def _io_by_name(tree: ast.Module, constants: set[str]) -> list[int]:
    """Lines of ``tree`` where a call that reads or writes a file is handed a path built from ``constants``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called not in IO_CALLS:
            continue
        handed = [*node.args, *(k.value for k in node.keywords), *([func.value] if isinstance(func, ast.Attribute) else [])]
        if any(isinstance(n, ast.Name) and n.id in constants for arg in handed for n in ast.walk(arg)):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize("name", FORMATS)
def test_one_module_reads_and_writes_the_format(name):
    constants, owner = FORMATS[name]
    io = {path: lines for path, tree in _sources().items() if (lines := _io_by_name(tree, constants))}
    assert set(io) <= {owner}, io


def test_the_finder_finds_a_reader_outside_the_bottom_floor():
    tree = ast.parse("def f(run_dir):\n    return yaml.safe_load((run_dir / CONFIG).read_text())\n")
    assert _io_by_name(tree, {"CONFIG"}) == [2]


def _fail_replace(monkeypatch, failing: str) -> None:
    """``os.replace`` raises when it would put ``failing`` in place: a writer killed at its rename."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == failing:
            raise OSError(28, "No space left on device")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def test_a_status_write_that_fails_leaves_the_previous_status_whole(tmp_path, monkeypatch):
    job_status.write_job_status(tmp_path, "running", ["seed=1"], None)
    _fail_replace(monkeypatch, "status.json")
    with pytest.raises(OSError):
        job_status.write_job_status(tmp_path, "failed", ["seed=1"], "boom")
    assert job_status.read_job_status(tmp_path) == {"status": "running", "overrides": ["seed=1"], "error": None}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary file left


def test_a_damaged_status_is_named_and_listed_as_a_failed_job(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "status.json").write_text('{"status": "fai')  # a writer of old, killed half-way
    with pytest.raises(job_status.StatusError, match=r"0/status.json"):
        job_status.read_job_status(tmp_path / "0")
    failed = load.failed_jobs(tmp_path)
    assert failed.job_dir.tolist() == [str(tmp_path / "0")] and "status.json" in failed.error.iloc[0]


def test_the_run_config_is_staged_durably_and_read_back(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    staged = run_config.stage_run_config(tmp_path, "seed: 3\nhooks: {}\n")
    assert staged.name != CONFIG and str(staged) in synced  # fsynced under its temporary name for the commit
    staged.rename(tmp_path / CONFIG)
    assert run_config.read_run_config(tmp_path) == {"seed": 3, "hooks": {}}
    (tmp_path / CONFIG).write_text("- a list\n")
    with pytest.raises(run_config.RunConfigError, match="not a mapping"):
        run_config.read_run_config(tmp_path)


def test_a_resume_point_is_one_file_and_a_failed_save_keeps_the_previous_one(tmp_path, monkeypatch):
    rows = pa.table({"step": [0, 1], "loss": [0.5, 0.25]})
    state = {"step": 2, "rng": torch.get_rng_state(), "model": {"w": torch.arange(3.0)}}
    resume_point.write_resume_point(tmp_path, state, {"steps.parquet": rows})
    assert [p.name for p in tmp_path.iterdir()] == [resume_point.RESUME]
    _fail_replace(monkeypatch, resume_point.RESUME)
    with pytest.raises(OSError):
        resume_point.write_resume_point(tmp_path, {**state, "step": 3}, {"steps.parquet": rows.slice(0, 1)})
    read, tables = resume_point.read_resume_point(tmp_path)
    assert read["step"] == 2 and torch.equal(read["model"]["w"], torch.arange(3.0))
    assert tables["steps.parquet"].equals(rows)
    assert [p.name for p in tmp_path.iterdir()] == [resume_point.RESUME]  # no temporary file left
    resume_point.remove_resume_point(tmp_path)
    assert resume_point.read_resume_point(tmp_path) is None
