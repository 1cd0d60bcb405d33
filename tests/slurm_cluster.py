"""The one-node Slurm cluster of the ``slurm`` group (``scripts/slurm-single-node.sh``): the session
fixture that brings it up, and how the tests submit a sweep to it and find its jobs.

The fixture brings the cluster up (installing Debian's packages when they are missing) and stops it
at the end if it started it; a machine that cannot run Slurm (not root, no apt-get, a daemon that
does not come up) skips the tests that use it with the script's reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/slurm-single-node.sh"  # as the README writes it, from the repository root
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="session")
def slurm():
    """The cluster, up for the session; stopped afterwards when this session started it."""
    if os.geteuid() != 0:
        pytest.skip("cannot run Slurm here: not root (the script runs the daemons as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("cannot run Slurm here: no slurmctld and no apt-get to install it")
    was_up = "slurmctld: running" in sh(f"{SCRIPT} status").stdout
    proc = sh(SCRIPT)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    yield
    if not was_up:
        assert sh(f"{SCRIPT} stop").returncode == 0


def sh(command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, env=ENV, **kwargs)


def submit(command: str, sweep_dir: Path) -> subprocess.Popen:
    """``command`` (a shell line) into ``sweep_dir``, running in the background."""
    return subprocess.Popen(f"{command} hydra.sweep.dir={sweep_dir}", shell=True, cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def array_id(sweep_dir: Path) -> str:
    """The id of the sweep's last job array: submitit's folders ``SWEEP/.submitit/<id>`` (those without
    ``_``; a resumed sweep has one per command)."""
    return max((p.name for p in (sweep_dir / ".submitit").iterdir() if "_" not in p.name), key=int)
