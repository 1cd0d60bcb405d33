"""Every clip sweep of the README clips symmetrically: each job's composed ``hooks.clip`` has ``min == -max``.

``hooks.clip.max=0.1,0.01`` alone left the preset's ``min: -0.01`` in every job, so the first job
clipped to ``[-0.01, 0.1]``: the README sweeps both bounds together (``hooks.clip={min:..,max:..},...``).
"""
from __future__ import annotations

import re
import shlex

from conftest import make_config
from runner.cli.early import expand
from docs_text import everything

TEXT = everything()


def clip_sweeps() -> list[str]:
    """The ``python -m runner -m`` commands of README.md and the docs pages (code blocks) that sweep a clip entry."""
    found = []
    for block in re.findall(r"^```\w*\n(.*?)^```", TEXT, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").split("#", 1)[0].strip()
            if line.startswith("python -m runner -m ") and "hooks.clip" in line and line not in found:
                found.append(line)
    return found


def jobs(command: str) -> list[list[str]]:
    """The overrides of each job of the sweep (as the command line expands it), without Hydra's own settings."""
    return expand([w for w in shlex.split(command)[4:] if not w.startswith("hydra")])


SWEEPS = clip_sweeps()


def test_the_readme_has_clip_sweeps():
    assert len(SWEEPS) >= 3, SWEEPS


def test_every_job_of_a_readme_clip_sweep_clips_symmetrically():
    # each distinct setting of the hooks once: the other overrides (model, seed, ...) do not touch hooks.clip
    settings = {tuple(o for o in job if o.startswith("hooks")) for command in SWEEPS for job in jobs(command)}
    assert len(settings) >= 4, settings
    for setting in sorted(settings):
        clip = make_config(*setting).hooks.clip
        assert clip.min == -clip.max, (setting, clip.min, clip.max)
