"""What checking a sweep's jobs before the first one runs does once rather than per job, and that what it
keeps is never served stale: the schemas' structured templates (``common.schema_merge.schema_template``),
and the job directories of the default ``hydra.sweep.subdir`` (``runner.cli.job_files.job_dirs``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import OmegaConf

import runner.cli.job_files as job_files
from common.schema_merge import merged, schema_template
from runner.config.compose import compose_config, compose_with_hydra
from runner.config.schema import RunConfig
from runner.engine.plan import compile_settings


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
