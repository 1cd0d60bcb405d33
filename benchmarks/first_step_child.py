"""``python -m benchmarks.first_step_child MARK ARGS``: ``python -m runner ARGS`` that writes the moment its
first job's first step has ended to MARK (``time.time()`` and the process's CPU seconds), and exits there.

The child of ``benchmarks.sweep_start``: what it times is the wait before a sweep's first step, so
the rest of the sweep is not run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from runner.engine import loop


def main() -> None:
    mark, argv = Path(sys.argv[1]), sys.argv[2:]
    step = loop.train_step

    def first(*args, **kwargs):
        out = step(*args, **kwargs)
        spent = os.times()
        mark.write_text(json.dumps({"time": time.time(), "cpu": spent.user + spent.system}))
        sys.stdout.flush()
        os._exit(0)  # the first step is what is timed: the sweep's other jobs are not run
        return out

    loop.train_step = first  # the loop calls it by its module name
    sys.argv = [sys.argv[0], *argv]
    from runner.__main__ import main as runner_main

    runner_main()


if __name__ == "__main__":
    main()
