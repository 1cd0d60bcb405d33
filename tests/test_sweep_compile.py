"""A sweep is checked at the cost of about one composition: jobs derived from the first job's config
are the configs Hydra composes, share its meta model, and are refused exactly as alone."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
import runner.config.compose as compose_module
import runner.engine.plan_cache as plan_cache
from runner.cli.commandline import check_command_line
from runner.cli.early import expand
from runner.cli.sweep_compile import JobComposer
from runner.config.compose import compose_job
from runner.engine.plan import compile_plan
from runner.engine.plan_cache import built_on_meta, shared_meta_models

ROOT = Path(__file__).resolve().parents[1]
#: Values of every scalar kind, as Hydra reads them: ints (a range), floats, quoted text, null, a bool,
#: an interpolation; each job differs from the first in some of them.
VALUES = ["model=mlp", "hooks=ablate", "hooks.ablate.layers=fc1,fc2", "hooks.ablate.index=range(0,3)",
          "seed=0,7", "optimizer=sgd", "optimizer.lr=1e-3,0.5", "sample.batch=null,1",
          "hooks.ablate.op=zero,mean", "progress=true,false", "loss=sum", "data.seed=${seed}"]


def _yaml(cfg) -> str:
    return OmegaConf.to_yaml(cfg)


def test_jobs_derived_from_the_first_are_the_configs_hydra_composes():
    jobs = expand(VALUES)
    assert len(jobs) == 2 * 3 * 2 * 2 * 2 * 2 * 2
    composer = JobComposer()
    for job in jobs[::23] + jobs[-1:]:  # a spread of them: each is composed by Hydra below
        mine, remote = composer.compose(job)[:2]
        theirs, their_remote = compose_job(job)
        assert _yaml(mine) == _yaml(theirs) and remote == their_remote, job
    assert composer.derived == len(jobs[::23] + jobs[-1:]) - 1  # Hydra composed the first alone


@pytest.mark.parametrize("argv, why", [
    (["model=convnet", "hooks=clip", "hooks.clip={min:-1,max:1},{min:-0.1}"], "a dict Hydra merges"),
    (["model=convnet,mlp"], "a preset group"),
    (["model=convnet", "hooks=clip", "++hooks.clip.min=-1,-2"], "a key forced in"),
    (["model=convnet", "hooks=clip", "hooks.clip.max=1,2", "hooks.clip={max:3}"], "a key a later dict also sets"),
])
def test_what_hydra_does_not_apply_by_replacing_a_value_is_composed_by_hydra(argv, why):
    composer = JobComposer()
    for job in expand(argv):
        assert _yaml(composer.compose(job)[0]) == _yaml(compose_job(job)[0]), why
    assert composer.derived == 0, why


def test_a_value_the_config_refuses_is_hydras_own_line():
    job = ["model=convnet", "steps=abc"]
    with pytest.raises(ConfigError) as alone:
        compose_job(job)
    problems = check_command_line(["-m", "model=convnet", "steps=2,abc"]).problems
    assert problems == ["sweep rejected before any job ran: 1 of 2 jobs are invalid", f"job 1 (model=convnet steps=abc): {alone.value}"]


def hydra_compositions(monkeypatch) -> list:
    """Each Hydra composition the check makes from now on (the overrides of each)."""
    composed = []
    hydra_compose = compose_module.compose
    monkeypatch.setattr(compose_module, "compose",
                        lambda *args, **kwargs: composed.append(kwargs["overrides"]) or hydra_compose(*args, **kwargs))
    return composed


def test_one_index_out_of_range_refuses_the_sweep_as_that_job_alone_is_refused(monkeypatch):
    composed = hydra_compositions(monkeypatch)
    built = []
    monkeypatch.setattr(plan_cache, "build_model", lambda cfg: built.append(cfg) or plan_cache_build(cfg))
    argv = ["model=convnet", "hooks=ablate", "hooks.ablate.layers=conv", "hooks.ablate.index=0,1,2,3,4,5,99,6"]
    checked = check_command_line(["-m", *argv])
    assert len(composed) == 1 and len(built) == 1  # one Hydra composition, one meta model for 8 jobs
    bad = expand(argv)[6]
    with pytest.raises(ConfigError) as alone:
        compile_plan(compose_job(bad)[0], bad)
    assert "out of range" in str(alone.value)
    assert checked.problems == ["sweep rejected before any job ran: 1 of 8 jobs are invalid",
                                f"job 6 ({' '.join(bad)}): {alone.value}"]
    # every valid job's plan is at its job number, for the overrides Hydra gives that job
    assert [(overrides, plan is not None) for overrides, plan in checked.plans] == [
        (job, i != 6) for i, job in enumerate(expand(argv))]


@pytest.mark.parametrize("multirun", [False, True])
def test_a_command_naming_its_directory_is_composed_once_to_check_it(tmp_path, monkeypatch, multirun):
    """The first job's directories (``hydra.run.dir``, ``hydra.sweep.dir``) are looked up in the config
    the check composed, not in a second composition; a directory holding the run is still refused."""
    argv = ["-m"] * multirun + ["model=convnet", "steps=1,2" if multirun else "steps=1",
                                f"hydra.{'sweep' if multirun else 'run'}.dir={tmp_path}"]
    composed = hydra_compositions(monkeypatch)
    assert check_command_line(argv).problems == [] and len(composed) == 1
    (tmp_path / ("0" if multirun else "")).mkdir(exist_ok=True)
    (tmp_path / ("0" if multirun else "") / "manifest.json").write_text("{}")
    problems = check_command_line(argv).problems
    assert len(problems) == 1 and "already holds" in problems[0] and len(composed) == 2


plan_cache_build = plan_cache.build_model


def test_a_meta_model_is_shared_only_as_built():
    cfg = compose_job(["model=convnet"])[0].model
    assert built_on_meta(cfg) is not built_on_meta(cfg)  # outside a sweep's check: built each time
    with shared_meta_models():
        first = built_on_meta(cfg)
        assert built_on_meta(cfg) is first
        handle = first.fc.register_forward_hook(lambda *args: None)  # an entry that left a hook behind
        again = built_on_meta(cfg)
        assert again is not first and built_on_meta(cfg) is again
        handle.remove()
        again.fc.weight.requires_grad_(False)  # or changed a parameter
        assert built_on_meta(cfg) is not again
        assert type(built_on_meta(compose_job(["model=mlp"])[0].model)).__name__ != type(again).__name__


@pytest.mark.slow
def test_the_real_command_refuses_a_sweep_with_one_index_out_of_range_and_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "runner", "-m", "model=convnet", "hooks=ablate",
                           "hooks.ablate.layers=conv", "hooks.ablate.index=0,1,2,3,4,5,6,7,99", f"hydra.sweep.dir={sweep}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "error: sweep rejected before any job ran: 1 of 9 jobs are invalid"
    assert lines[1].startswith("error: job 8 (") and "hooks.ablate.index: '[99]'" in lines[1] and len(lines) == 2
    assert not sweep.exists()


def test_the_sweeper_is_hydras_basic_one_without_its_second_composition():
    from hydra_plugins.runner_sweeper.sweeper import CheckedSweeper
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from runner.config.compose import compose_with_hydra

    assert compose_with_hydra(["model=convnet"]).hydra.sweeper._target_ == \
        f"{CheckedSweeper.__module__}.{CheckedSweeper.__name__}"
    assert [name for name in vars(CheckedSweeper) if not name.startswith("_")] == ["validate_batch_is_legal"]
    assert issubclass(CheckedSweeper, BasicSweeper)


COUNT_COMPOSITIONS = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
count = []
load = ConfigLoaderImpl.load_sweep_config
ConfigLoaderImpl.load_sweep_config = lambda self, *a, **k: count.append(1) or load(self, *a, **k)
sys.argv = ["runner", *sys.argv[1:]]
from runner.__main__ import main
try:
    main()
finally:
    print("sweep compositions:", len(count))
"""


@pytest.mark.slow
def test_hydra_s_launcher_composes_no_job_again(tmp_path):
    """The launcher runs the check's compositions (``runner/cli/checked_jobs.py``): its ``load_sweep_config`` is
    never called (Hydra's basic sweeper alone called it 6 times for 3 jobs; test_compose_once counts every
    composition: one per job)."""
    done = subprocess.run([sys.executable, "-c", COUNT_COMPOSITIONS, "-m", "model=linear", "hooks=none", "seed=0,1,2",
                           "quiet=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "sweep compositions: 0" in done.stdout
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1", "2"]
