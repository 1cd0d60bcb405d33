"""``python -m runner [overrides]``: the command line is checked, then Hydra runs each job's plan;
``python -m runner replay=RUN_DIR`` runs a finished run again (``runner.cli.replay``)."""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner.cli import replay
from runner.cli.commandline import check_command_line
from runner.cli.execute import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, execute
from runner.cli.replay import is_replay
from runner.cli.warning_lines import one_line_warnings
from runner.config.compose import CONF_DIR


def main() -> None:
    one_line_warnings()
    if is_replay(sys.argv[1:]):  # no Hydra: the stored config is run as it is (runner.cli.replay)
        sys.exit(replay.main(sys.argv[1:]))
    checked = check_command_line(sys.argv[1:])
    for line in checked.problems:
        print(f"error: {line}", file=sys.stderr)
    if checked.problems:
        sys.exit(EXIT_CONFIG_ERROR)

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def hydra_main(cfg: DictConfig) -> None:  # each job runs the plan the check compiled for it
        hydra_cfg = HydraConfig.get()
        execute(cfg, hydra_cfg.runtime.output_dir, list(hydra_cfg.overrides.task),
                multirun=hydra_cfg.mode == RunMode.MULTIRUN, plan=checked.plan_for(cfg))

    try:
        hydra_main()
    except KeyboardInterrupt:  # outside a job (Hydra composing the next one): no traceback, the jobs' record says the rest
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
