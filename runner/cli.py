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
    """Run the experiment (or print its plan) and draw ``plots``; on a ``ConfigError`` print
    ``error: ...`` and exit 2."""
    try:
        if cfg.get("plan"):
            text, ok = plan(cfg)
            print(text)
            if not ok:
                sys.exit(EXIT_CONFIG_ERROR)
            return
        if cfg.get("plots"):
            from runner import plots  # matplotlib is imported only when pictures are asked for

            plots.check_plots(cfg)
        run(cfg, out_dir, overrides)
        if cfg.get("plots"):
            for path in plots.write_plots(out_dir, cfg):
                print(f"wrote {path}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    print(f"wrote {out_dir}")
