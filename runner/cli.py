"""What ``python -m runner`` does with a composed config: run it, turning user errors into one line."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from hooks.errors import ConfigError
from runner.plan import plan
from runner.run import run

#: Exit status for a configuration error (argparse's convention for usage errors).
EXIT_CONFIG_ERROR = 2


def execute(cfg: DictConfig, out_dir: str | Path, overrides: Sequence[str]) -> None:
    """Run the experiment (or print its plan); on a ``ConfigError`` print ``error: ...``, exit 2."""
    try:
        if cfg.get("plan"):
            text, ok = plan(cfg)
            print(text)
            if not ok:
                sys.exit(EXIT_CONFIG_ERROR)
            return
        run(cfg, out_dir, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    print(f"wrote {out_dir}")
