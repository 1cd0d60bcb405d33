"""The one durable write (``common.durable``) and the one manifest reader (``common.manifest``).

A durable file is fsynced before its rename and its directory after it; a write that fails leaves
the earlier file as it was and no temporary file. Every fsync of the project goes through
``common.durable`` and only ``common.manifest`` defines a manifest reader: a new twin fails here.
"""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from common.durable import replaced, staged
from common.manifest import ManifestError, read_manifest

ROOT = Path(__file__).resolve().parents[1]


def calls(monkeypatch, fail: str | None = None) -> list[str]:
    """Log each ``os.fsync`` (as ``fsync FILE`` or ``fsync DIR``) and ``os.replace``; ``fail``: that call raises."""
    log = []
    real = {name: getattr(os, name) for name in ("fsync", "replace")}

    def fsync(fd):
        log.append("fsync DIR" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync FILE")
        if log[-1] == fail:
            raise OSError(5, "injected")
        return real["fsync"](fd)

    def replace(src, dst):
        log.append("replace")
        if fail == "replace":
            raise OSError(5, "injected")
        return real["replace"](src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return log


def test_a_durable_file_is_fsynced_renamed_and_its_directory_fsynced_in_that_order(tmp_path, monkeypatch):
    path = tmp_path / "store.json"
    path.write_text("old")
    log = calls(monkeypatch)
    with replaced(path) as tmp:
        assert tmp == tmp_path / f".store.json.tmp-{os.getpid()}" and tmp.parent == path.parent
        tmp.write_text("new")
        assert path.read_text() == "old"  # nothing is seen under the final name before the rename
    assert log == ["fsync FILE", "replace", "fsync DIR"]
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["store.json"]
    log.clear()
    with replaced(path, sync_directory=False) as tmp:
        tmp.write_text("newer")
    assert log == ["fsync FILE", "replace"] and path.read_text() == "newer"


@pytest.mark.parametrize("fail", ["writer", "fsync FILE", "replace"])
def test_a_failed_durable_write_leaves_the_earlier_file_and_no_temporary_one(tmp_path, monkeypatch, fail):
    path = tmp_path / "shard"
    path.write_text("old")
    calls(monkeypatch, fail)
    with pytest.raises((OSError, RuntimeError)):
        with replaced(path) as tmp:
            tmp.write_text("half")
            if fail == "writer":
                raise RuntimeError("the writer failed")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["shard"]


def test_a_staged_file_stays_under_its_temporary_name_fsynced_or_is_removed(tmp_path, monkeypatch):
    log = calls(monkeypatch)
    with staged(tmp_path / "config.yaml") as tmp:
        tmp.write_text("a: 1")
    assert log == ["fsync FILE"] and tmp.name == f".config.yaml.tmp-{os.getpid()}" and tmp.read_text() == "a: 1"
    with pytest.raises(KeyboardInterrupt), staged(tmp_path / "other.yaml") as other:
        other.write_text("b")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name]


def test_the_manifest_reader_says_none_for_no_run_and_one_line_for_a_damaged_manifest(tmp_path):
    assert read_manifest(tmp_path) is None and read_manifest(tmp_path / "no such dir") is None
    (tmp_path / "manifest.json").write_text(json.dumps({"complete": True, "run_id": "r"}))
    assert read_manifest(tmp_path) == {"complete": True, "run_id": "r"}
    for text, reason in (('{"complete": tr', "not a JSON manifest (Expecting value: line 1 column 14 (char 13))"),
                         ("[1, 2]", "not a JSON manifest (a list, not an object)"),
                         (b"\xff\xfe", "not a JSON manifest (")):
        (tmp_path / "manifest.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ManifestError) as damaged:
            read_manifest(tmp_path)
        assert str(damaged.value).startswith(f"{tmp_path / 'manifest.json'}: {reason}") and "\n" not in str(damaged.value)
        assert isinstance(damaged.value, ValueError)


def _project_files() -> list[Path]:
    return [p for package in ("common", "hooks", "runner") for p in (ROOT / package).rglob("*.py")]


def test_every_fsync_is_the_durable_helper_s_and_the_manifest_has_one_reader():
    fsyncs, readers = [], []
    for path in _project_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "fsync":
                fsyncs.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.FunctionDef) and node.name == "read_manifest":
                readers.append(str(path.relative_to(ROOT)))
    assert sorted(set(fsyncs)) == ["common/durable.py"]
    assert readers == ["common/manifest.py"]
