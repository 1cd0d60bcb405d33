"""The scheduler's words as the runner's one line, without a cluster: sbatch's refusals, stuck
sweeps, the run state of a job Slurm ended, and the launcher presets' required partition."""
from __future__ import annotations

from conftest import run_main
from runner.cli.scheduler import PendingWatch, parse_squeue, run_state, sbatch_error, trace_error

PARAMS = {"partition": "gpu", "gpus_per_node": 1, "gres": None, "cpus_per_task": 8, "mem_gb": 32, "timeout_min": 120}


def test_sbatch_refusals_name_the_launcher_key_in_one_line():
    partition = ("sbatch: error: invalid partition specified: gpu\n"
                 "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    gres = "sbatch: error: Invalid generic resource (gres) specification\n"
    assert sbatch_error(partition, PARAMS) == (
        "hydra.launcher.partition: sbatch refused the jobs: invalid partition specified: gpu "
        "(partition='gpu'; sinfo shows what the cluster has)")
    assert sbatch_error(gres, PARAMS).startswith("hydra.launcher.gpus_per_node: sbatch refused the jobs: Invalid generic")
    assert "\n" not in sbatch_error(gres, PARAMS)
    assert sbatch_error("sbatch: error: Batch job submission failed: Unable to contact slurm controller\n", PARAMS) == (
        "hydra.launcher: sbatch refused the jobs: Unable to contact slurm controller")


def test_a_sweep_pending_for_an_unschedulable_reason_is_stuck_after_the_wait_only():
    rows = parse_squeue("7_0|PENDING|PartitionConfig\n7_1|PENDING|PartitionConfig\n")
    assert rows == {"7_0": ("PENDING", "PartitionConfig"), "7_1": ("PENDING", "PartitionConfig")}
    watch = PendingWatch(limit_s=10)
    assert watch.stuck(rows, now=100.0) is None
    assert watch.stuck(rows, now=109.0) is None
    assert watch.stuck(rows, now=110.0) == "PartitionConfig"


def test_a_busy_cluster_or_a_started_sweep_is_not_stuck():
    busy = {"7_0": ("PENDING", "Resources"), "7_1": ("PENDING", "Priority")}
    watch = PendingWatch(limit_s=0)
    assert watch.stuck(busy, now=0.0) is None and watch.stuck(busy, now=1e6) is None
    assert PendingWatch(limit_s=0, reasons=["Resources", "Priority"]).stuck(busy, now=0.0) == "Priority, Resources"
    started = PendingWatch(limit_s=0)
    assert started.stuck({"7_0": ("RUNNING", "None"), "7_1": ("PENDING", "PartitionConfig")}, now=0.0) is None
    assert started.stuck({"7_1": ("PENDING", "PartitionConfig")}, now=5.0) is None  # one job ran: it fits
    assert PendingWatch(limit_s=None).stuck({"7_0": ("PENDING", "PartitionConfig")}, now=1e9) is None


def test_slurm_states_of_jobs_without_a_result_become_run_states():
    assert [run_state(s) for s in ("CANCELLED by 0", "TIMEOUT", "FAILED", "OUT_OF_MEMORY", "")] == [
        "cancelled", "timeout", "failed", "failed", "failed"]


def test_a_slurm_preset_without_its_partition_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    proc = run_main(monkeypatch, capsys, "-m", "hydra/launcher=slurm_cpu", "model=linear", "seed=0,1",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.code == 2
    assert proc.stderr.strip().splitlines() == [
        "error: hydra.launcher.partition: required by hydra/launcher=slurm_cpu; give it, e.g. "
        "hydra.launcher.partition=NAME (sinfo lists the partitions)"]
    assert not (tmp_path / "sweep").exists()


def test_the_presets_settings():
    from hydra import compose, initialize_config_dir

    from runner.config.compose import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        gpu, cpu = (compose(config_name="config", overrides=[f"hydra/launcher={name}", "hydra.launcher.partition=p"],
                            return_hydra_config=True).hydra.launcher for name in ("slurm", "slurm_cpu"))
    assert (gpu.gpus_per_node, gpu.cpus_per_task, gpu.mem_gb) == (1, 8, 32)
    assert (cpu.gpus_per_node, cpu.cpus_per_task, cpu.mem_gb) == (None, 1, 2)
    for launcher in (gpu, cpu):
        assert (launcher.timeout_min, launcher.signal_delay_s, launcher.max_num_timeout) == (120, 120, 3)
        assert (launcher.unschedulable_after_s, launcher.array_parallelism) == (120, 64)
        assert "PartitionConfig" in launcher.unschedulable_reasons and "Resources" not in launcher.unschedulable_reasons


def test_a_job_that_raised_is_reported_by_its_exception_line():
    message = ("Job (task=0) failed during processing with trace:\n----------------------\n"
               "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
               "RuntimeError: boom\n\n----------------------\n"
               "You can check full logs with 'job.stderr(0)' and 'job.stdout(0)'or at paths:\n"
               "  - /sweep/.submitit/7_0/7_0_0_log.err\n  - /sweep/.submitit/7_0/7_0_0_log.out\n")
    assert trace_error(message) == "RuntimeError: boom"
    assert trace_error("Job got killed for an unknown reason.") == "Job got killed for an unknown reason."
