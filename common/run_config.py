"""A run's ``config.yaml``: the resolved config a run commits with its data files; one writer, one reader.

The run stages it beside its tables (``stage_run_config``: the durable write, left under its
temporary name for the commit to rename with the tables, ``runner.store.commit``), so a run made
outside Hydra, or moved away from its ``.hydra/``, still says how it was made. Replay, a resumed
sweep's check of a kept run, a patch's stored source run and the analysis read it here.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from common.durable import staged
from common.records import CONFIG

#: Hydra's copy of the composed config in a job's directory, read when a run has no ``config.yaml``.
HYDRA_CONFIG = Path(".hydra") / CONFIG


class RunConfigError(ValueError):
    """A ``config.yaml`` that is not YAML or not a mapping (the message names the file)."""


def stage_run_config(out_dir: str | Path, config_yaml: str) -> Path:
    """``config_yaml`` written and fsynced under ``out_dir``'s temporary name for ``config.yaml``; return that path."""
    with staged(Path(out_dir) / CONFIG) as tmp:
        tmp.write_text(config_yaml)
    return tmp


def run_config_text(run_dir: str | Path) -> str:
    """The text of ``run_dir``'s ``config.yaml`` (``OSError`` when it cannot be read; ``FileNotFoundError``: none)."""
    return (Path(run_dir) / CONFIG).read_text()


def read_run_config(run_dir: str | Path) -> dict:
    """``run_dir``'s ``config.yaml`` as a mapping (``{}`` for an empty file).

    Raises:
        OSError: it cannot be read (``FileNotFoundError``: there is none).
        RunConfigError: it is not YAML, or not a mapping.
    """
    try:
        found = yaml.safe_load(run_config_text(run_dir)) or {}
    except yaml.YAMLError as exc:
        raise RunConfigError(f"{Path(run_dir) / CONFIG}: not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(found, dict):
        raise RunConfigError(f"{Path(run_dir) / CONFIG}: holds {type(found).__name__}, not a mapping")
    return found


def saved_config_path(run_dir: str | Path) -> Path | None:
    """The run's saved config: its ``config.yaml``, else Hydra's ``.hydra/config.yaml``, else ``None``."""
    for path in (Path(run_dir) / CONFIG, Path(run_dir) / HYDRA_CONFIG):
        if path.is_file():
            return path
    return None
