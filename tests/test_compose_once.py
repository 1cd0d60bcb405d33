"""Each job is composed once and its plan handed over as the object the check compiled.

Counted here: every composition Hydra makes (``ConfigLoaderImpl.load_configuration``: Hydra's compose
API, ``hydra.main`` and a launcher's ``load_sweep_config`` all compose through it) and the plans
compiled, for a CLI run, a sweep, ``runner.attach`` and a replay. ``runner.attach`` reuses a composition
while the files it read, its search path and the registrations are unchanged: an edited preset is
composed again.
"""
from __future__ import annotations

import copy
import os
import types
from dataclasses import dataclass

import pytest
import torch
import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl  # where every composition of Hydra's goes
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from torch import nn

import runner
from runner.cli import checked_jobs, commandline, execute as execute_module, replay as replay_module
from runner.cli.checked_jobs import UncheckedJob
from runner.cli.commandline import check_command_line
from runner.config import compose as compose_module
from runner.config.compose import compose_with_hydra
from conftest import run_main


@dataclass
class Counts:
    composed: list  #: the overrides of each composition Hydra made
    checked: list  #: the overrides of each plan the check compiled
    compiled_again: list  #: plans compiled anywhere else
    handed: list  #: the overrides of each job config a launcher was handed (the check's, not composed)


@pytest.fixture
def counts(monkeypatch) -> Counts:
    """Hydra's compositions, the plans the check compiled, those compiled anywhere else, the job configs handed over."""
    seen = Counts([], [], [], [])
    monkeypatch.setattr(compose_module, "_COMPOSED", {})  # no composition kept from an earlier test
    load, handed = ConfigLoaderImpl.load_configuration, checked_jobs.CheckedConfigs.load_sweep_config
    check_compile, again = commandline.compile_plan, execute_module.compile_plan
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **k: seen.composed.append(list(k["overrides"])) or load(self, *a, **k))
    monkeypatch.setattr(checked_jobs.CheckedConfigs, "load_sweep_config",
                        lambda self, master, job: seen.handed.append(list(job)) or handed(self, master, job))
    monkeypatch.setattr(commandline, "compile_plan",
                        lambda *a, **k: seen.checked.append(a[1]) or check_compile(*a, **k))
    monkeypatch.setattr(execute_module, "compile_plan", lambda *a, **k: seen.compiled_again.append(a) or again(*a, **k))
    monkeypatch.setattr(replay_module, "compile_plan", lambda *a, **k: seen.compiled_again.append(a) or again(*a, **k))
    return seen


RUN = ["model=mlp", "hooks=stats", "steps=1", "quiet=true"]


def test_a_command_line_run_is_composed_and_compiled_once(counts, monkeypatch, capsys, tmp_path):
    ran = run_main(monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path / 'run'}")
    assert ran.code == 0, ran.stderr
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert counts.composed == [[*RUN, f"hydra.run.dir={tmp_path / 'run'}"]]  # by the check; Hydra's main composed none
    assert len(counts.checked) == 1 and counts.compiled_again == []


def test_each_job_of_a_sweep_is_composed_once_and_runs_the_plan_the_check_compiled_for_it(counts, monkeypatch, capsys,
                                                                                          tmp_path):
    ran = run_main(monkeypatch, capsys, "-m", *RUN, "seed=1,2,3", f"hydra.sweep.dir={tmp_path}")
    assert ran.code == 0, ran.stderr
    jobs = [[*RUN, f"seed={seed}", f"hydra.sweep.dir={tmp_path}"] for seed in (1, 2, 3)]
    assert counts.composed == jobs[:1]  # the other two jobs differ in a value: derived from the first
    handed = [checked_jobs.settings_of(job) for job in counts.handed]  # as the sweeper spells them: quiet=True
    assert handed == [checked_jobs.settings_of(job) for job in jobs]  # the launcher composed none again
    assert counts.checked == jobs and counts.compiled_again == []
    for num, seed in enumerate((1, 2, 3)):  # job N ran job N's plan: its seed is in its manifest
        assert yaml.safe_load((tmp_path / str(num) / "config.yaml").read_text())["seed"] == seed


def test_a_sweep_that_composes_each_job_composes_each_once(counts, monkeypatch, capsys, tmp_path):
    """Jobs that differ in a preset are each composed by Hydra: once each, by the check."""
    ran = run_main(monkeypatch, capsys, "-m", "model=mlp,linear", "hooks=stats", "steps=1", "quiet=true",
                   f"hydra.sweep.dir={tmp_path}")
    assert ran.code == 0, ran.stderr
    assert counts.composed == [[f"model={name}", "hooks=stats", "steps=1", "quiet=true", f"hydra.sweep.dir={tmp_path}"]
                               for name in ("mlp", "linear")]
    assert [yaml.safe_load((tmp_path / str(num) / "config.yaml").read_text())["model"]["name"] for num in (0, 1)] == [
        "mlp", "linear"]


def test_each_job_runs_under_the_config_hydra_composes_for_it(monkeypatch, capsys, tmp_path):
    """What a job's ``.hydra/`` holds (its config, Hydra's node: overrides, override_dirname, number, mode) is
    what Hydra's own composition of that job gives, though Hydra composed none of them for the run."""
    sweep = ["hooks.stats.kinds=[output],[output,grad_output]",
             "hydra.job.config.override_dirname.exclude_keys=[quiet]"]
    ran = run_main(monkeypatch, capsys, "-m", *RUN, "seed=1,2", *sweep, f"hydra.sweep.dir={tmp_path}",
                   "hydra.sweep.subdir=${hydra.job.override_dirname}")
    assert ran.code == 0, ran.stderr
    for num, (seed, kinds) in enumerate([(1, "[output]"), (1, "[output,grad_output]"), (2, "[output]"),
                                         (2, "[output,grad_output]")]):
        task = [*RUN[:3], "quiet=True", f"seed={seed}", f"hooks.stats.kinds={kinds}"]  # as Hydra's sweeper spells them
        hydra = ["hydra.job.config.override_dirname.exclude_keys=[quiet]", f"hydra.sweep.dir={tmp_path}",
                 "hydra.sweep.subdir=${hydra.job.override_dirname}", "hydra.mode=MULTIRUN"]
        theirs = compose_with_hydra([*hydra, *task])
        out = tmp_path / theirs.hydra.job.override_dirname
        written = yaml.safe_load((out / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert yaml.safe_load((out / ".hydra" / "config.yaml").read_text()) == yaml.safe_load(
            OmegaConf.to_yaml(compose_module.job_config(copy.deepcopy(theirs))[0]))
        assert written["overrides"] == OmegaConf.to_container(theirs.hydra.overrides)
        assert written["job"]["override_dirname"] == theirs.hydra.job.override_dirname
        assert (written["job"]["num"], written["mode"]) == (num, "MULTIRUN")


def test_a_job_the_check_did_not_compile_is_said_loudly_never_compiled_again():
    checked = check_command_line(["-m", *RUN, "seed=1,2"])
    assert checked.problems == []
    with pytest.raises(UncheckedJob, match="job 1 .*seed=7"):
        checked.plan_for(1, [*RUN, "seed=7"])  # not job 1's overrides
    with pytest.raises(UncheckedJob, match="job 2"):
        checked.plan_for(2, [*RUN, "seed=2"])  # no job 2
    plan = checked.plan_for(1, ["hooks=stats", "model=mlp", "steps=1", "quiet=true", "seed=2"])
    assert plan is not None
    assert checked.plan_for(1, [*RUN, "seed=2"]) is plan  # a requeued job asks again (tests/test_slurm.py)


def test_a_launcher_asking_for_a_job_the_check_did_not_compose_is_refused_never_composed(counts):
    checked = check_command_line(["-m", *RUN, "seed=1,2"])
    configs = checked_jobs.CheckedConfigs(checked.command.composed)
    master = checked_jobs.with_hydra(checked.command.composed[0], RUN, checked_jobs.RunMode.MULTIRUN)
    assert configs.load_sweep_config(master, [*RUN, "seed=2"]).seed == 2
    counts.composed.clear()
    with pytest.raises(UncheckedJob, match="seed=7"):
        configs.load_sweep_config(master, [*RUN, "seed=7"])
    with pytest.raises(UncheckedJob, match="compose"):
        configs.load_configuration("config", RUN, checked_jobs.RunMode.RUN)
    assert counts.composed == []


def test_a_replay_composes_nothing_and_compiles_once(counts, monkeypatch, capsys, tmp_path):
    assert run_main(monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path / 'run'}").code == 0
    counts.composed.clear(), counts.checked.clear()
    ran = run_main(monkeypatch, capsys, f"replay={tmp_path / 'run'}", f"replay.out={tmp_path / 'again'}")
    assert ran.code == 0, ran.stderr
    assert counts.composed == [] and counts.checked == [] and len(counts.compiled_again) == 1


PRESET = """# @package hooks.mine
defaults:
  - /hook_schema/clamp@_here_
  - _self_
layers: "**"
min: -{bound}
max: {bound}
"""


def test_attach_blocks_compose_once_and_an_edited_preset_is_composed_again(counts, tmp_path):
    """100 attach blocks of one preset from the user's own search path; the preset is edited after block 50."""
    conf = tmp_path / "conf"
    (conf / "hooks").mkdir(parents=True)
    preset = conf / "hooks" / "mine.yaml"
    preset.write_text(PRESET.format(bound=0.5))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    bounds = []
    for block in range(100):
        if block == 50:
            preset.write_text(PRESET.format(bound=0.25))
        out = tmp_path / "runs" / str(block)
        with runner.attach(model, hooks=["mine"], overrides=[f"hydra.searchpath=[file://{conf}]"], out_dir=out) as run:
            loss = model(x).pow(2).sum() * 100  # gradients well beyond either bound: the clamp acts
            loss.backward()
            clamped = max(p.grad.abs().max().item() for p in model.parameters())
            model.zero_grad()
            run.step(loss)
        recorded = yaml.safe_load((out / "config.yaml").read_text())["hooks"]["mine"]["max"]
        bounds.append((recorded, clamped))
    assert len(counts.composed) == 2  # once, and once more after the edit
    assert bounds == [(0.5, 0.5)] * 50 + [(0.25, 0.25)] * 50


def test_a_schema_registered_between_two_compositions_is_composed_again(counts):
    overrides = ["model=mlp", "hooks=stats"]
    first = compose_module.compose_plain(overrides)
    assert compose_module.compose_plain(overrides) == first and len(counts.composed) == 1
    store = ConfigStore.instance()
    store.store(group="hook_schema", name="stats", node=store.load("hook_schema/stats.yaml").node)  # stored again
    assert compose_module.compose_plain(overrides) == first and len(counts.composed) == 2


def test_a_caller_changing_its_composition_does_not_change_the_next_one(counts):
    first = compose_module.compose_plain(["model=mlp"])
    first["model"]["name"] = "changed"
    assert compose_module.compose_plain(["model=mlp"])["model"]["name"] == "mlp"


def test_unchanged_presets_are_not_read_again(counts, monkeypatch):
    """A composition reused reads no file of ``conf/`` again: each one's stat is compared, its contents kept."""
    compose_module.compose_plain(RUN)
    read = []
    monkeypatch.setattr(compose_module, "open", lambda path, *a: read.append(path) or open(path, *a), raising=False)
    assert compose_module.compose_plain(RUN)["hooks"]["stats"]["type"] == "stats"
    assert read == [] and len(counts.composed) == 1


def test_a_preset_edited_to_the_same_size_and_time_is_composed_again(counts, tmp_path, monkeypatch):
    """The modification time put back (``os.utime``, or an edit within one tick of the file system's clock) and
    the size unchanged: the change time still says it. Here a file is trusted as soon as it is read."""
    monkeypatch.setattr(compose_module, "_SETTLED_NS", -10**18)
    conf = tmp_path / "conf"
    (conf / "hooks").mkdir(parents=True)
    preset = conf / "hooks" / "mine.yaml"
    preset.write_text(PRESET.format(bound=0.5))
    overrides = ["hooks=mine", f"hydra.searchpath=[file://{conf}]"]
    assert compose_module.compose_plain(overrides)["hooks"]["mine"]["max"] == 0.5
    before = preset.stat()
    preset.write_text(PRESET.format(bound=0.7))
    os.utime(preset, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert preset.stat().st_size == before.st_size and preset.stat().st_mtime_ns == before.st_mtime_ns
    assert compose_module.compose_plain(overrides)["hooks"]["mine"]["max"] == 0.7
    assert len(counts.composed) == 2


def test_a_preset_changed_within_two_seconds_of_its_read_is_read_again(counts, tmp_path, monkeypatch):
    """An edit within the file system's clock tick may keep every stat field: a file that new is not trusted.
    (The module's clock is held at one second after the preset's last change, so that a slow first
    composition cannot outlast the window; the project's own files, checked out before the suite began,
    are older than the window then, and are read once.)"""
    assert compose_module._SETTLED_NS == 2_000_000_000
    conf = tmp_path / "conf"
    (conf / "hooks").mkdir(parents=True)
    preset = conf / "hooks" / "mine.yaml"
    preset.write_text(PRESET.format(bound=0.5))
    changed = max(preset.stat().st_mtime_ns, preset.stat().st_ctime_ns)
    monkeypatch.setattr(compose_module, "time", types.SimpleNamespace(time_ns=lambda: changed + 10**9))
    overrides = ["hooks=mine", f"hydra.searchpath=[file://{conf}]"]
    compose_module.compose_plain(overrides)
    read = []
    monkeypatch.setattr(compose_module, "open", lambda path, *a: read.append(path) or open(path, *a), raising=False)
    compose_module.compose_plain(overrides)
    assert read == [str(preset)] and len(counts.composed) == 1
