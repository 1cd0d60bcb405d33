"""The commit of a run directory: its data files become final together, with the manifest, or not at all.

``manifest.json`` is the commit point: it is renamed into place only after every data file is
durable under its final name, and a reader trusts the directory only when it is there.
``commit`` does, in order:

1. write the new manifest under a temporary name (the *intent*, listing the files it will put in
   place and those of an earlier run it replaces), fsync it and the directory;
2. rename the data files of an earlier run aside (``.stats.parquet.old-RUNID``), then rename
   each new data file (already fsynced by its writer) to its final name; fsync the directory;
3. rename the intent to ``manifest.json`` (the commit point) and fsync the directory;
4. delete the files set aside.

``recover`` returns an interrupted directory to exactly one complete run, or to none: while an
intent exists the commit point was not reached, so the files set aside go back and the new
ones go; once the manifest names the run, what was set aside is deleted. It never deletes a
file that ``manifest.json`` lists. The run calls it after an interrupted commit, the next claim
of the directory after a crash (SIGKILL, power loss).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from common.durable import TMP_MARK, fsync_dir, staged
from common.manifest import read_manifest
from common.run_config import stage_run_config
from common.records import CONFIG, MANIFEST, RUN_TOTAL_SCHEMAS, TABLES
from runner.store.errors import naming

OLD_MARK = ".old-"
#: The data files a run may commit (the tables and the resolved config); their final names are the runner's alone.
DATA_FILES = (*TABLES, *RUN_TOTAL_SCHEMAS, CONFIG)


def _aside(path: Path, run_id: str) -> Path:
    return path.with_name(f".{path.name}{OLD_MARK}{run_id}")


def stage_config(out_dir: Path, config_yaml: str) -> Path:
    """The run's resolved config, fsynced under its temporary name: committed with the data files, so
    that a run made outside Hydra (or moved away from its ``.hydra/``) still says how it was made."""
    with naming(out_dir / CONFIG):
        return stage_run_config(out_dir, config_yaml)


def commit(out_dir: Path, temps: dict[str, Path], manifest: dict) -> None:
    """Put the durable temporary files ``temps`` (final name -> path) in place with ``manifest``.

    ``manifest`` must hold ``run_id``; ``replaced`` (the earlier run's data files) is added.
    """
    run_id = manifest["run_id"]
    replaced = [name for name in DATA_FILES if (out_dir / name).exists()]
    with naming(out_dir / MANIFEST):
        with staged(out_dir / MANIFEST) as intent:
            intent.write_text(json.dumps({**manifest, "replaced": replaced}, indent=2) + "\n")
        fsync_dir(out_dir)
    for name in replaced:
        with naming(out_dir / name):
            os.replace(out_dir / name, _aside(out_dir / name, run_id))
    for name, tmp in temps.items():
        with naming(out_dir / name):
            os.replace(tmp, out_dir / name)
    with naming(out_dir / MANIFEST):
        fsync_dir(out_dir)
        os.replace(intent, out_dir / MANIFEST)
        fsync_dir(out_dir)
    _drop_aside(out_dir, run_id)


def _drop_aside(out_dir: Path, run_id: str) -> None:
    for name in DATA_FILES:
        _aside(out_dir / name, run_id).unlink(missing_ok=True)


def recover(out_dir: Path) -> None:
    """Finish or undo an interrupted ``commit`` and delete every temporary file (see the module doc).

    Only for a directory this process has claimed: another run's files in progress look the same.
    """
    with naming(out_dir):
        for intent in out_dir.glob(f".{MANIFEST}{TMP_MARK}*"):
            try:
                pending = json.loads(intent.read_text())
            except ValueError:
                continue  # cut short while being written: no file was renamed yet
            for name in pending["replaced"]:
                if _aside(out_dir / name, pending["run_id"]).exists():
                    os.replace(_aside(out_dir / name, pending["run_id"]), out_dir / name)
            for name in set(pending["files"]) - set(pending["replaced"]):
                (out_dir / name).unlink(missing_ok=True)
        run_id = (read_manifest(out_dir) or {}).get("run_id")
        if run_id:
            _drop_aside(out_dir, run_id)
        for tmp in out_dir.glob(f".*{TMP_MARK}*"):
            tmp.unlink(missing_ok=True)
        fsync_dir(out_dir)
