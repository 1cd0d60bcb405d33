"""What checking a sweep's jobs before the first one runs does once rather than per job, and that what it
keeps is never served stale: the schemas' structured templates (``common.schema_merge.schema_template``),
the job directories of the default ``hydra.sweep.subdir`` (``runner.cli.job_files.job_dirs``), the run
settings without a masked copy (``runner.engine.plan.run_settings``), and a derived job's config merged
into the schema as the first job's with its values replaced (``runner.engine.plan.Replaced``), a stored
run's reads shared by the jobs (``common.rundir.shared_reads``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

import common.rundir as rundir
import runner.cli.job_files as job_files
from common.errors import ConfigError
from common.schema_merge import merged, schema_template
from runner.cli.commandline import check_command_line
from runner.config.compose import compose_config, compose_with_hydra
from runner.config.schema import RunConfig
from runner.engine import plan as plan_module
from runner.engine.plan import compile_plan, compile_settings


def _schema(default: float):
    @dataclasses.dataclass
    class Clip:  # the same name each time: a class defined again is another schema
        max: float = default
        layers: list = dataclasses.field(default_factory=lambda: ["fc1"])
    return Clip


def test_a_schema_is_built_into_a_structured_config_once_for_every_merge(monkeypatch):
    schema_template.cache_clear()
    built = []
    structured = OmegaConf.structured
    monkeypatch.setattr(OmegaConf, "structured", lambda obj, *a, **k: built.append(obj) or structured(obj, *a, **k))
    cfg = compose_config(["model=mlp", "hooks=clip"])
    for _ in range(3):
        compile_settings(cfg)
    assert built.count(RunConfig) == 1  # three compiles, one structured RunConfig (it was one per compile)


def test_a_kept_template_is_never_served_changed_nor_for_another_class():
    first = _schema(1.0)
    one = merged(first, {"max": 2.0}, "hooks.clip")
    one.max, one.layers[0] = 5.0, "changed"  # a merge's result is the caller's to change
    again = merged(first, {}, "hooks.clip")
    assert OmegaConf.to_container(again) == {"max": 1.0, "layers": ["fc1"]}
    assert OmegaConf.to_container(merged(_schema(3.0), {}, "hooks.clip")) == {"max": 3.0, "layers": ["fc1"]}
    fresh = OmegaConf.merge(OmegaConf.structured(first), {"max": 2.0})
    assert OmegaConf.to_yaml(merged(first, {"max": 2.0}, "hooks.clip")) == OmegaConf.to_yaml(fresh)
    assert OmegaConf.get_type(merged(first, {}, "hooks.clip")) is first


def test_the_default_subdir_names_each_job_by_its_number_without_naming_its_node(monkeypatch, tmp_path):
    named = []
    name_job = job_files.name_job
    monkeypatch.setattr(job_files, "name_job", lambda node, task: named.append(task) or name_job(node, task))
    jobs = [(num, ["model=mlp", f"seed={num}"]) for num in range(4)]
    numbered = compose_with_hydra(["model=mlp", f"hydra.sweep.dir={tmp_path}"])
    assert job_files.job_dirs(numbered, jobs) == [tmp_path / str(num) for num in range(4)]
    assert named == []  # each job's node was named: 0.2 s of CPU for 64 jobs, three times a sweep
    by_id = compose_with_hydra(["model=mlp", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.id}"])
    assert job_files.job_dirs(by_id, jobs) == [tmp_path / str(num) for num in range(4)]  # Hydra's own way, the same
    by_name = compose_with_hydra(["model=mlp", f"hydra.sweep.dir={tmp_path}",
                                  "hydra.sweep.subdir=${hydra.job.override_dirname}"])
    assert job_files.job_dirs(by_name, jobs) == [Path(tmp_path) / f"model=mlp,seed={num}" for num in range(4)]


@pytest.mark.parametrize("overrides", [
    ["model=mlp", "hooks=[clip,stats]", "logger=[tensorboard]", "sample.batch=2", "memory.budget=1GiB", "plots=[]"],
    ["model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "metric.diff=[3,4]", "hooks=patch", "resume=failed"],
    ["model=mlp", "epochs=2", "output.row_group_mb=3", "seed=7", "stop_after=fc1"],
])
def test_the_run_settings_are_those_of_a_masked_copy_of_the_config(overrides):
    """``run_settings`` converts each setting on its own: the same ``RunConfig``, field for field and type for type."""
    typed = plan_module._typed(compose_config(overrides))
    mine = plan_module.run_settings(typed)
    theirs = RunConfig(**OmegaConf.to_object(OmegaConf.masked_copy(typed, plan_module.SETTINGS)))
    assert mine == theirs
    assert [type(getattr(mine, name)) for name in plan_module.SETTINGS] == \
        [type(getattr(theirs, name)) for name in plan_module.SETTINGS]


#: A sweep whose jobs differ from the first in replaced values of every scalar kind, one an interpolation's target.
SWEEP = ["model=mlp", "hooks=ablate", "hooks.ablate.layers=fc1", "hooks.ablate.index=0,2", "seed=0,7",
         "optimizer=sgd", "optimizer.lr=1e-3,0.5", "sample.batch=null,1", "progress=true,false", "data.seed=${seed}"]


def test_a_derived_jobs_plan_is_the_plan_compiled_alone():
    """Each job's config merged into the schema is the first job's with its values replaced: its plan's
    settings and config.yaml are those the job compiled alone (``data.seed=${seed}`` resolves to its own seed)."""
    checked = check_command_line(["-m", *SWEEP])
    assert checked.problems == [] and len(checked.plans) == 32
    for job, plan in checked.plans:
        alone = compile_plan(compose_config(job), job)
        assert plan.config_yaml == alone.config_yaml, job
        assert plan.settings == alone.settings and plan.optimizer == alone.optimizer, job
        assert [hook.spec for hook in plan.hooks] == [hook.spec for hook in alone.hooks], job


def test_a_sweep_merges_its_first_jobs_config_into_the_schema_and_no_other(monkeypatch):
    merges = []
    merge = OmegaConf.merge
    monkeypatch.setattr(OmegaConf, "merge", lambda *configs: merges.append(configs[0] is schema_template(RunConfig))
                        or merge(*configs))
    assert check_command_line(["-m", "model=mlp", "hooks=ablate", "hooks.ablate.layers=fc1",
                               "hooks.ablate.index=0,1,2,3"]).problems == []
    assert merges.count(True) == 2  # the first job's compile, and its config kept for the others (was one a job)


def test_a_value_a_derived_job_is_refused_for_is_the_line_the_job_alone_gives():
    job = ["model=mlp", "hooks=ablate", "hooks.ablate.layers=fc1", "sample.every=0"]
    with pytest.raises(ConfigError) as alone:
        compile_plan(compose_config(job), job)
    problems = check_command_line(["-m", *job[:-1], "sample.every=1,0"]).problems
    assert problems[1:] == [f"job 1 ({' '.join(job)}): {alone.value}"]


GPT = ["model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "metric.diff=[3,4]"]


@pytest.fixture
def clean_run(run_with):
    """A stored run of gpt2_tiny keeping both blocks' outputs: what a patching sweep's jobs read."""
    return run_with(*GPT, "hooks=extract", r"hooks.extract.layers=re:transformer\.h\.\d+")


def _table_reads(monkeypatch) -> list:
    reads = []
    read_table = rundir.pq.read_table
    monkeypatch.setattr(rundir.pq, "read_table", lambda path, **kwargs: reads.append(path) or read_table(path, **kwargs))
    return reads


def test_a_sweep_check_reads_its_stored_run_once_for_each_thing_it_asks(clean_run, monkeypatch):
    reads = _table_reads(monkeypatch)
    argv = ["-m", *GPT, "hooks=patch", f"hooks.patch.source={clean_run}", "hooks.patch.layers=transformer.h.0,transformer.h.1",
            "hooks.patch.index=range(0,4)"]
    assert check_command_line(argv).problems == []
    assert len(reads) == 4  # its steps, its layers, and the tensors of each of the two layers (three a job before)


def test_a_shared_read_is_the_files_and_a_file_written_again_is_read_again(clean_run, monkeypatch):
    fresh = rundir.stored_tensors(str(clean_run), ["transformer.h.0"], "output", "hooks.patch.source")
    reads = _table_reads(monkeypatch)
    with rundir.shared_reads():
        first = rundir.stored_tensors(str(clean_run), ["transformer.h.0"], "output", "hooks.patch.source")
        again = rundir.stored_tensors(str(clean_run), ["transformer.h.0"], "output", "hooks.patch.source")
        assert len(reads) == 2 and again is not first and again.keys() == fresh.keys()
        assert all(torch.equal(again[key], fresh[key]) for key in fresh)
        tensors = clean_run / "tensors.parquet"
        table = pq.read_table(tensors)
        pq.write_table(table.slice(0, 1), tensors)  # another run's file under the same name
        changed = rundir.stored_tensors(str(clean_run), ["transformer.h.0"], "output", "hooks.patch.source")
        assert len(reads) == 5 and len(changed) == 1  # read again: its layers, its tensors
    rundir.stored_tensors(str(clean_run), ["transformer.h.0"], "output", "hooks.patch.source")
    assert len(reads) == 7  # outside a check, every read is made
