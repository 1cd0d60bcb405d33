"""``python -m runner [overrides]``: Hydra composes the config, ``runner.cli`` runs it."""
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner.cli.execute import execute


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    execute(cfg, hydra_cfg.runtime.output_dir, list(hydra_cfg.overrides.task),
            multirun=hydra_cfg.mode == RunMode.MULTIRUN)


if __name__ == "__main__":
    main()
