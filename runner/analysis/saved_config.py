"""Where a run keeps its config: read without pandas by the summary a run prints when it ends."""
from __future__ import annotations

from pathlib import Path

from common.records import CONFIG


def config_path(run_dir: str | Path) -> Path | None:
    """The run's saved config: the resolved ``config.yaml``, else Hydra's ``.hydra/config.yaml``, else ``None``."""
    for path in (Path(run_dir) / CONFIG, Path(run_dir) / ".hydra" / "config.yaml"):
        if path.is_file():
            return path
    return None
