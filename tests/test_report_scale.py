"""Reports that scale: a 64-job patching sweep and a 1,000-job stats sweep, checked by size and structure.

Each sweep is one real run copied into its job directories, each with its own overrides in its
manifest, as a Hydra multirun leaves them (``benchmarks.sweep_load`` makes its sweeps the same way).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import make_config, run
from runner.analysis import report
from runner.analysis.patching import patching_table

pytestmark = pytest.mark.soak

PATCH = ["model=convnet", "data.seed=1", "loss=none", "mode=eval", "metric.target=0", "hooks=patch",
         "hooks.patch.source=clean", "hooks.patch.layers=conv", "hooks.patch.index=3"]


def copies(template: Path, sweep: Path, overrides: list[list[str]]) -> Path:
    manifest = json.loads((template / "manifest.json").read_text())
    for num, own in enumerate(overrides):
        shutil.copytree(template, sweep / str(num))
        (sweep / str(num) / "manifest.json").write_text(json.dumps({**manifest, "overrides": own}))
    return sweep


def pictures(page: str) -> list[str]:
    return re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', page)


@pytest.fixture(scope="module")
def patching_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("patching")
    template = run(make_config(*PATCH), tmp / "template", PATCH)
    jobs = [[*PATCH[:6], f"hooks.patch.layers=block{num // 16}", f"hooks.patch.index={num % 16}"][-3:]
            + ["hooks.patch.source=clean"] for num in range(64)]
    sweep = copies(template, tmp / "sweep", jobs)
    return sweep, report.write_report(sweep).read_text()


def test_a_64_job_patching_sweep_gets_its_heatmap_and_table_not_64_pictures(patching_page):
    sweep, page = patching_page
    assert pictures(page) == ["recovered fraction per layer and index"]
    assert '<section id="pictures">' not in page  # each job is a cell of the heatmap: no pictures of its own
    section = page.split('<section id="patching"><h2>Activation patching</h2>', 1)[1].split("</section>", 1)[0]
    assert section.count("</tr>") == 1 + 64  # the header and one row per job
    assert len(page.encode()) < 1_000_000


def test_jobs_are_in_numeric_order_in_the_report_and_the_table(patching_page):
    sweep, page = patching_page
    jobs = page.split('<section id="jobs">', 1)[1].split("</section>", 1)[0]
    assert re.findall(r"<tr>\s*<td>(\d+)</td>", jobs) == [str(n) for n in range(64)]
    table = patching_table(sweep, metric="logit")
    assert list(table["layer"]) == [f"block{n // 16}" for n in range(64)]
    assert list(table["index"]) == [n % 16 for n in range(64)]


@pytest.fixture(scope="module")
def stats_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stats")
    overrides = ["model=mlp", "hooks=stats", "steps=2"]
    template = run(make_config(*overrides), tmp / "template", overrides)
    sweep = copies(template, tmp / "sweep", [["model=mlp", "hooks=stats", f"seed={num}"] for num in range(1000)])
    return report.write_report(sweep).read_text()


def test_a_1000_job_stats_sweep_report_is_a_few_mb_with_capped_pictures(stats_page):
    page = stats_page
    assert len(page.encode()) < 4_000_000
    assert len(pictures(page)) == report.MOST_JOB_PICTURES  # one gradient flow per job drawn, of the first jobs
    assert f"the other {1000 - report.MOST_JOB_PICTURES}" in page
    assert page.count("<pre>") == report.MOST_CONFIGS
    jobs = page.split('<section id="jobs">', 1)[1].split("</section>", 1)[0]
    assert re.findall(r"<tr>\s*<td>(\d+)</td>", jobs) == [str(n) for n in range(1000)]
    assert "Activation patching" not in page and "Unit statistics" not in page  # nothing for them here


def test_the_page_reads_top_down(stats_page, patching_page):
    for page in (stats_page, patching_page[1]):
        order = [page.index(f'<section id="{key}">') for key in report.SECTIONS if f'<section id="{key}">' in page]
        assert order == sorted(order) and len(order) >= 6
        assert page.index("<img") < page.index('<section id="layers">')
        layers = page.split('<section id="layers">', 1)[1].split("</h2>", 1)[1].split("</section>", 1)[0]
        assert layers.lstrip().startswith("<details><summary>")  # collapsed
        summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
        assert "report: python -m runner.report" in summary
