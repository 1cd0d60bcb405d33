"""``python -m runner [overrides]``: the command line is checked, then Hydra runs each job's plan;
``python -m runner replay=RUN_DIR`` runs a finished run again (``runner.cli.replay``).

Every job is composed and its choices checked before torch is imported (``runner.cli.early``), so
a mistake in a key or a choice is answered at the cost of importing Hydra; the rest of the check
(each job's plan: the gate) and the run import torch after it.
"""
import sys

from runner.cli import startup_gc
from runner.cli.exit_codes import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED
from runner.cli.warning_lines import one_line_warnings


def main() -> None:
    from runner.cli.early import compose_command_line, is_replay  # Hydra: after the collector's pause

    one_line_warnings()
    argv = sys.argv[1:]
    if is_replay(argv):  # no Hydra: the stored config is run as it is (runner.cli.replay)
        startup_gc.resume(collect_first=False)
        from runner.cli import replay

        sys.exit(replay.main(argv))
    composed = compose_command_line(argv)
    _exit_on(composed.headed())
    from runner.cli.commandline import check_command_line  # torch: only once the command line composes

    checked = check_command_line(argv, composed)
    _exit_on(checked.problems)
    startup_gc.resume(collect_first=composed.multirun)
    _run_jobs(checked)


def _exit_on(problems: list[str]) -> None:
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        sys.exit(EXIT_CONFIG_ERROR)


def _run_jobs(checked) -> None:
    """Hydra runs each job (its directory, logging, callbacks, the sweep), handed the config the check
    composed and the plan it compiled for it (``runner.cli.checked_jobs``); ``hydra.main`` only for what
    runs no job (``--help``, ``--cfg``, ...)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from runner.cli.execute import execute

    def run_plan(cfg: DictConfig) -> None:  # each job runs the plan the check compiled for it
        hydra_cfg = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        task = list(hydra_cfg.overrides.task)
        execute(cfg, hydra_cfg.runtime.output_dir, task, multirun=multirun,
                plan=checked.plan_for(hydra_cfg.job.num if multirun else 0, task))

    command = checked.command
    try:
        if command is None or command.other_mode:
            _hydra_main(run_plan)
        else:
            from runner.cli.checked_jobs import run_checked

            run_checked(command.composed, command.multirun, command.overrides, run_plan)
    except KeyboardInterrupt:  # outside a job (Hydra composing the next one): no traceback, the jobs' record says the rest
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


def _hydra_main(task) -> None:
    """Hydra's own ``main`` on the command line: its help, a config printed, ..."""
    import hydra

    from runner.config.compose import CONF_DIR

    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(task)()


if __name__ == "__main__":
    startup_gc.pause()  # the process starts without the cyclic collector; main resumes it for the jobs
    main()
