"""Every file a run writes has the run's permissions, those of any new file under its umask (``0o644`` under
``022``, ``0o600`` under ``077``): the parquet files, ``manifest.json``, ``config.yaml``, a store's
safetensors shards and ``store.json`` (safetensors itself writes ``0o600``: a colleague on a shared cluster
could not read the activations beside readable parquet files), a requeued job's resume point, the report,
and the compiled statistics kernel in the cache."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import make_config, run
from hooks.kernels import native
from runner.analysis.report import write_report
from runner.engine import loop
from common.resume_point import RESUME

UMASKS = [0o022, 0o077]
STORE = ("model=digits_cnn", "data=digits", "mode=eval", "epochs=1", "loss=none", "progress=false",
         "hooks=[store,stats]", "hooks.store.layers=[fc]", "hooks.store.shard_size=700", "data.batch_size=600", "hooks.stats.layers=[fc]", "hooks.stats.kinds=[output]")
TRAINING = ("model=convnet", "data=fake", "data.shape=[4,3,8,8]", "loss=cross_entropy", "optimizer=adam", "steps=4",
            "hooks=stats")


@pytest.fixture(params=UMASKS, ids=oct)
def umask(request):
    """The process's umask for the test, put back after it."""
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def modes(*directories: Path) -> dict[str, str]:
    """``{file: its permission bits}`` of every file under ``directories``."""
    return {str(p.relative_to(directory.parent)): oct(p.stat().st_mode & 0o777)
            for directory in directories for p in sorted(directory.rglob("*")) if p.is_file()}


def kinds(files) -> set[str]:
    return {Path(name).suffix for name in files}


def test_a_runs_files_a_stores_shards_and_its_report_have_the_umasks_permissions(tmp_path, umask):
    out, store = tmp_path / "run", tmp_path / "store"
    run(make_config(*STORE, f"hooks.store.path={store}"), out, STORE)
    write_report(out)
    found = modes(out, store)
    assert {".parquet", ".json", ".yaml", ".safetensors", ".html"} <= kinds(found), found
    assert {name: mode for name, mode in found.items() if mode != oct(0o666 & ~umask)} == {}


def test_a_requeued_jobs_resume_point_has_the_umasks_permissions(tmp_path, umask, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    real, calls = loop.train_step, []

    def requeued_in_the_third_step(*args):  # as submitit's handler does: the steps before are kept
        calls.append(1)
        if len(calls) == 3:
            raise SystemExit(-1)
        return real(*args)

    monkeypatch.setattr(loop, "train_step", requeued_in_the_third_step)
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        run(make_config(*TRAINING), out, TRAINING)
    assert (out / RESUME).is_file()  # one file: the state and the rows kept so far
    assert oct((out / RESUME).stat().st_mode & 0o777) == oct(0o666 & ~umask)


def test_the_compiled_kernel_in_the_cache_has_the_umasks_permissions(tmp_path, umask):
    compiler = native.compiler_command()
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): no kernel to build")
    target = tmp_path / "cache" / "stats_kernel.so"
    native.build(compiler, target)
    assert modes(tmp_path / "cache") == {"cache/stats_kernel.so": oct(0o666 & ~umask)}
