"""Loading a big sweep: ``runner.analysis`` against a pyarrow dataset over the same files.

The sweep is made from one real run (``TEMPLATE``: ``hooks=stats``, resnet18, 10 steps, 1,200
rows of statistics; ``--quick`` takes a 2-step convnet) copied into ``jobs`` job directories, each with its own overrides in its manifest,
as a Hydra multirun leaves them. The peer is what a user would write with pyarrow alone:
``ds.dataset(files).to_table(columns, filter).to_pandas()``, which knows nothing of runs,
overrides or renamed columns, and returns text as strings and each shape as an array where
``load_stats`` returns categoricals. Both read the same files in the same process, interleaved.
Memory is measured in a child process: the peak resident memory the load adds, against the
memory of the frame it returns.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from benchmarks.process import ROOT, runner_args

#: (name, columns, filters) of each read; ``None`` reads everything.
READS = [
    ("whole", None, None),
    ("4 columns", ["layer", "kind", "step", "l2"], None),
    ("filtered (kind = grad_output)", None, [("kind", "=", "grad_output")]),
]


#: The run every job of the benchmark's sweep copies: 1,200 rows of statistics.
TEMPLATE = ["hooks=stats", "model=resnet18", "data.shape=[2,3,32,32]", "steps=10"]


def make_sweep(out: Path, jobs: int, template_overrides: list[str] = TEMPLATE) -> Path:
    """A sweep directory of ``jobs`` copies of one real ``hooks=stats`` run, distinct overrides each."""
    template = out / "template"
    subprocess.run([sys.executable, *runner_args(str(template), *template_overrides)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    manifest = json.loads((template / "manifest.json").read_text())
    sweep = out / "sweep"
    for i in range(jobs):
        job = sweep / str(i)
        shutil.copytree(template, job)
        overrides = [f"seed={i}", f"hooks.stats.layers={['all', 'conv'][i % 2]}", f"lr={10 ** -(i % 4)}"]
        (job / "manifest.json").write_text(json.dumps({**manifest, "overrides": overrides}))
    return sweep


def pyarrow_read(sweep: Path, columns, filters):
    files = sorted(str(p) for p in sweep.rglob("stats.parquet"))
    expression = None if filters is None else pq.filters_to_expression(filters)
    return ds.dataset(files, format="parquet").to_table(columns=columns, filter=expression).to_pandas()


def timings(sweep: Path, reps: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each read by ``load_stats`` and by the pyarrow peer, interleaved ``reps`` times."""
    import runner.analysis as analysis

    out: dict[str, dict[str, list[float]]] = {name: {"runner": [], "pyarrow": []} for name, _, _ in READS}
    for _ in range(reps):
        for name, columns, filters in READS:
            for who, read in (("runner", analysis.load_stats), ("pyarrow", pyarrow_read)):
                start = time.perf_counter()
                df = read(sweep, columns, filters)
                out[name][who].append(time.perf_counter() - start)
                del df
    return out


# VmHWM, not ru_maxrss: Linux carries a forked child's ru_maxrss over from its parent (here the
# benchmark process, gigabytes), while exec starts a new address space and a new VmHWM.
# The libraries the load reads with (imported lazily by runner.analysis) are imported before the base is
# taken: what is measured is the memory of the data, not of pandas' and pyarrow's code.
MEMORY_CHILD = """
import sys
import pandas, pyarrow.dataset, pyarrow.parquet
import runner.analysis as analysis
def status(key):
    return int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith(key))) * 1024
base = status('VmRSS')
df = analysis.load_stats(sys.argv[1])
print(status('VmHWM') - base, int(df.memory_usage(deep=True).sum()), len(df))
"""


def memory(sweep: Path) -> tuple[int, int, int]:
    """(bytes the load added at its peak, bytes of the frame, rows), from a fresh child process."""
    done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(sweep)], cwd=ROOT, check=True,
                          capture_output=True, text=True)
    added, frame, rows = map(int, done.stdout.split())
    return added, frame, rows
