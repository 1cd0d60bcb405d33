"""The report page: every section from a real CLI sweep, abnormalities, and a real headless browser."""
from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_config, run
from runner.analysis import report

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
HOUSE = ROOT / "assets" / "house.png"
#: One sweep-wide comparison, the loss curves, then gradient flow, feature maps and Grad-CAM per job.
PICTURES = 2 + 2 * 3


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    """A two-job sweep made by the real CLI on the project's image, and its report."""
    sweep = tmp_path_factory.mktemp("sweep")
    args = ["-m", "model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=8", "data.crop=8",
            "loss=class_score", "hooks=[gradcam,stats,clip]", "hooks.gradcam.layers=conv",
            "hooks.clip.max=1,0.001", "hooks.clip.min=null", "steps=2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report.main([str(sweep)])  # what python -m runner.report runs
    assert printed.getvalue() == f"{sweep / 'report.html'}\n"
    return sweep / "report.html"


@pytest.mark.slow
def test_report_has_every_section_from_a_cli_sweep(sweep_report):
    page = sweep_report.read_text()
    for key, heading in report.SECTIONS.items():  # no units entry, no steering, no patching: those are left out
        assert (f'<section id="{key}"><h2>{heading}</h2>' in page) == (key not in ("steering", "units", "patching"))
    assert "hooks.clip.max=1</td>" in page and "hooks.clip.max=0.001</td>" in page  # each job's own override
    assert "Common to every job: <code>model=convnet data=image" in page
    configs = re.findall(r"<pre>(.*?)</pre>", page, re.S)
    assert len(configs) == 2 and all("name: class_score" in c for c in configs)
    assert "max: 0.001" in html.unescape(configs[1])
    for layer in ("conv", "relu", "flatten", "fc"):
        assert f"<td>{layer}</td>" in page
    assert "Nothing abnormal found." in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == PICTURES
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images)
    assert not re.search(r'(src|href)="(?!data:)', page) and "<link" not in page and "<script" not in page


def test_report_lists_abnormalities_and_a_missing_config(tmp_path):
    overrides = ["model=custom", "model._target_=test_analysis.DeadReLU", "+model.dead=2", "data.shape=[8,3]",
                 "hooks=[stats,zero_bias,extract]", "hooks.zero_bias.layers=fc2", "hooks.extract.layers=relu"]
    run_dir = run(make_config(*overrides), tmp_path / "run", overrides)
    (run_dir / "config.yaml").unlink()  # a run made before runs stored their config, outside Hydra
    out = report.write_report(run_dir, tmp_path / "page.html")
    page = out.read_text()
    abnormal = page.split('<section id="abnormal">')[1].split("</section>")[0]
    assert "1 finding(s), 1 layer(s) with dead units." in abnormal
    assert re.search(r"<td>zero_bias</td>\s*<td>fc2</td>\s*<td>param_grad</td>\s*<td>bias</td>\s*"
                     r"<td>zero gradient</td>", abnormal)
    assert re.search(r"<td>relu</td>\s*<td>0</td>\s*<td>4</td>\s*<td>2</td>\s*<td>0.5</td>", abnormal)
    assert "not recorded: the run was not made by" in page
    assert "not drawn: grad_cam: no layer with a kept 4-D output" in page


def test_report_command_rejects_a_path_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no complete run (a directory with manifest.json) at or under '{tmp_path}'")


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
#: Run in the page once it has loaded: what the browser made of it, stored where --dump-dom shows it.
PROBE = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.setAttribute('data-probe', JSON.stringify({
    images: imgs.length, decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    sections: [...document.querySelectorAll('section h2')].map(h => h.textContent),
    rows: document.querySelectorAll('#layers tbody tr').length, height: document.body.scrollHeight}));
});</script>"""


def render_in_chromium(page: Path, tmp_path: Path, probe: str = PROBE) -> dict:
    """Open ``page`` with ``probe`` added in headless Chromium; return what the probe saw (``data-probe``)."""
    opened = tmp_path / f"probe-{page.parent.name}.html"
    opened.write_text(page.read_text().replace("</body>", probe + "</body>"))
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
                           "--dump-dom", opened.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert found, "the page's load handler did not run"
    return json.loads(html.unescape(found.group(1)))


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install "
                                                              "chromium); the real-browser rendering check needs it")


@pytest.mark.slow
@needs_chromium
def test_report_renders_in_headless_chromium(sweep_report, tmp_path):
    seen = render_in_chromium(sweep_report, tmp_path)
    assert seen["sections"] == [h for key, h in report.SECTIONS.items() if key not in ("steering", "units", "patching")]
    assert seen["images"] == seen["decoded"] == PICTURES  # every embedded PNG decoded by the browser
    assert seen["rows"] > 0 and seen["height"] > 2000
