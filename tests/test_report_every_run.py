"""The report of every run and sweep the README shows, whatever it recorded: a page, never a traceback.

Each README example runs with a small model (convnet, mlp, linear, resnet18 at 32x32); sweeps are laid
out as Hydra's multirun lays them out (numbered job directories, each job's overrides in its manifest).
Every page is opened in headless Chromium, which must decode every embedded picture.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis import report
from test_report import needs_chromium, render_in_chromium

pytestmark = pytest.mark.docs_runs

ROOT = Path(__file__).resolve().parents[1]
HOUSE = str(ROOT / "assets" / "house.png")
SMALL_RESNET = ("model=resnet18", "data.shape=[2,3,32,32]")

#: One run per README command (the main job, the tutorial table, the Grad-CAM example), small models.
RUNS = {
    "main clip": ("model=convnet", "hooks=clip"),
    "stats": (*SMALL_RESNET, "hooks=stats"),
    "none": ("model=convnet", "hooks=none"),
    "print": ("model=convnet", "data=ones", "loss=none", "hooks=print"),
    "extract": (*SMALL_RESNET, "data=ones", "loss=none", "hooks=extract"),
    "clip log_mean": (*SMALL_RESNET, "data=ones", "loss=log_mean", "hooks=clip"),
    "zero_bias": ("model=convnet", "loss=one_minus_mean", "hooks=zero_bias"),
    "shift": ("model=linear", "hooks=shift"),
    "residual": ("model=linear", "hooks=residual"),
    "relu clamp": ("model=convnet", "hooks=[clip,stats]", "hooks.clip.target=output", "hooks.clip.layers=relu",
                   "hooks.clip.min=0", "hooks.clip.max=null"),
    "double_grad": ("model=convnet", "hooks=double_grad"),
    "print_grad": ("model=convnet", "hooks=print_grad"),
    "full_backward 42": ("model=linear", "data.requires_grad=true", "hooks=full_backward",
                         "hooks.full_backward.layers=''", "hooks.full_backward.replace=42"),
    "full_backward": ("model=convnet", "hooks=full_backward"),
    "backward_pre": ("model=convnet", "hooks=backward_pre"),
    "global_stats": ("model=convnet", "hooks=global_stats"),
    "post_accumulate": ("model=mlp", "hooks=post_accumulate"),
    "offload": ("model=convnet", "hooks=offload"),
    "node": ("model=convnet", "hooks=node"),
    "grad_cam": ("model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=8", "data.crop=8",
                 "loss=class_score", "hooks=[gradcam,stats]", "hooks.gradcam.layers=conv"),
}
TRAINING = ("model=convnet", "data=fake", "data.shape=[8,3,8,8]", "loss=cross_entropy", "optimizer=sgd",
            "optimizer.lr=0.1", "steps=4", "eval_every=2", "eval_steps=2")
#: One sweep per README sweep: each job's own overrides.
SWEEPS = {
    "hooks x model": [(*model, f"hooks={hooks}") for hooks in ("clip", "zero_bias")
                      for model in (SMALL_RESNET, ("model=convnet",))],
    "clip max x seed": [("model=convnet", "hooks=clip", f"hooks.clip.max={bound}", f"seed={seed}")
                        for bound in (0.1, 0.01, 0.001) for seed in range(2)],
    "training": [(*TRAINING, f"hooks={hooks}") for hooks in ("none", "clip")],
    "symmetric clip": [("model=convnet", "loss=class_score", "hooks=clip", f"hooks.clip={{min:-{b},max:{b}}}")
                       for b in (1000, 0.01, 0.0001)],
}
FAILED_ERROR = "RuntimeError: CUDA out of memory"


def _sweep(root: Path, jobs) -> Path:
    for i, overrides in enumerate(jobs):
        run(make_config(*overrides), root / str(i), list(overrides))
    return root


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every run and sweep above, with its report written: ``{name: (path, page text)}``."""
    root = tmp_path_factory.mktemp("every")
    paths = {name: run(make_config(*o), root / f"run{i}", list(o)) for i, (name, o) in enumerate(RUNS.items())}
    paths |= {name: _sweep(root / f"sweep{i}", jobs) for i, (name, jobs) in enumerate(SWEEPS.items())}
    failed = paths["symmetric clip"] / "3"  # a job of the sweep that failed: status, no manifest
    failed.mkdir()
    (failed / "status.json").write_text(json.dumps({"status": "failed", "error": FAILED_ERROR,
                                                    "overrides": ["model=convnet", "hooks.clip={min:-9,max:9}"]}))
    return {name: (path, report.write_report(path).read_text()) for name, path in paths.items()}


def _section(page: str, key: str) -> str:
    return page.split(f'<section id="{key}">')[1].split("</section>")[0]


def _headings(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<section id="(\w+)"><h2>(.*?)</h2>', page)


@pytest.mark.parametrize("name", [*RUNS, *SWEEPS])
def test_every_readme_run_and_sweep_gives_a_report(reports, name):
    path, page = reports[name]
    assert "Traceback" not in page
    stats = analysis.load_stats(path)
    kept = not analysis.load_tensors(path, filters=[("kind", "=", "output")]).empty
    has = {"summary": True, "steering": False, "abnormal": not stats.empty or kept, "pictures": "<img" in page, "units": False,
           "patching": False, "jobs": True, "failed": len(analysis.run_dirs(path)) > 1, "layers": not stats.empty,
           "config": True}  # none of these units or patches: a section with nothing for the runs is left out
    assert _headings(page) == [(key, heading) for key, heading in report.SECTIONS.items() if has[key]]
    if not stats.empty:
        assert _section(page, "layers").count("<tr>") >= 1  # data rows (the header row has a style)
    images = re.findall(r'src="data:image/png;base64,', page)
    drawn = sum(1 for r in analysis.run_dirs(path) if (analysis.load_stats(r)["kind"] != "saved").any())
    assert len(images) >= drawn  # a gradient-flow picture at least for every run with statistics


def test_a_run_that_recorded_nothing_has_its_summary_jobs_and_config_only(reports):
    _, page = reports["none"]
    assert [key for key, _ in _headings(page)] == ["summary", "jobs", "config"]
    assert "<img" not in page and "Left out" not in page and "not drawn" not in page


def test_sweep_sections_are_titled_by_their_overrides(reports):
    path, page = reports["clip max x seed"]
    headings = re.findall(r"<h3>(.*?)</h3>", _section(page, "pictures"))
    assert headings[0] == "Sweep: param_grad l2 per layer"
    assert headings[1:] == [f"{i}: hooks.clip.max={b} seed={s}" for i, (b, s) in
                            enumerate((b, s) for b in (0.1, 0.01, 0.001) for s in range(2))]


def test_failed_jobs_are_listed_with_their_error(reports):
    _, page = reports["symmetric clip"]
    failed = _section(page, "failed")
    assert "1 job(s) failed and wrote no data." in failed
    assert re.search(r"<td>3</td>\s*<td>model=convnet hooks.clip=\{min:-9,max:9\}</td>\s*"
                     rf"<td>{FAILED_ERROR}</td>", failed)
    assert '<p class="ok">No job failed.</p>' in reports["training"][1]


def test_job_summary_keeps_train_and_eval_apart(reports):
    path, page = reports["training"]
    steps = analysis.load_steps(path)
    runs = analysis.run_dirs(path)
    summary = report.job_summary(steps, runs)
    for r in runs:
        mine = steps[steps.run_dir == str(r)]
        train, evals = mine[mine.split == "train"], mine[mine.split == "eval"]
        assert len(evals) == 2 and len(train) == 4
        got = summary.loc[str(r)]
        assert got["train steps"] == 4
        assert got["last train loss"] == train.loss.iloc[-1] and got["last eval loss"] == evals.loss.iloc[-1]
    assert "<th>last eval loss</th>" in _section(page, "jobs") and "Loss per step" in page


def test_job_summary_gives_accuracy_where_the_steps_have_it(reports):
    path, _ = reports["training"]
    steps = analysis.load_steps(path)
    steps["accuracy"] = range(len(steps))
    summary = report.job_summary(steps, analysis.run_dirs(path))
    last = steps.groupby([steps.run_dir.astype(str), "split"]).accuracy.last()
    for r, row in summary.iterrows():
        assert (row["last train accuracy"], row["last eval accuracy"]) == (last[r, "train"], last[r, "eval"])
    no_eval = report.job_summary(steps[steps.split == "train"], analysis.run_dirs(path))
    assert "last eval loss" not in no_eval.columns and "last eval accuracy" not in no_eval.columns


#: Run in the combined page once it has loaded: per report, its section headings and its images decoded.
PROBE = """<script>window.addEventListener('load', () => {
  const seen = {};
  for (const article of document.querySelectorAll('article')) {
    const imgs = [...article.querySelectorAll('img')];
    seen[article.dataset.name] = {sections: [...article.querySelectorAll('section h2')].map(h => h.textContent),
      images: imgs.length, decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length};
  }
  document.body.setAttribute('data-probe', JSON.stringify(seen));
});</script>"""


@needs_chromium
def test_every_report_renders_in_headless_chromium(reports, tmp_path):
    """All the pages in one browser load: each report's body in an ``<article>`` of one page."""
    bodies = "\n".join(f'<article data-name="{html.escape(name)}">{page.split("<body>")[1].split("</body>")[0]}'
                       "</article>" for name, (_, page) in reports.items())
    combined = tmp_path / "all" / report.REPORT
    combined.parent.mkdir()
    combined.write_text(f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>all</title></head>'
                        f"<body>{bodies}{PROBE}</body></html>")
    seen = render_in_chromium(combined, tmp_path, probe="")
    assert set(seen) == set(reports)
    for name, (_, page) in reports.items():
        assert seen[name]["sections"] == [heading for _, heading in _headings(page)], name
        assert seen[name]["images"] == seen[name]["decoded"] == page.count("<img"), name


def test_what_no_job_of_a_sweep_could_draw_is_said_once_after_the_jobs(reports):
    """Six convnet clip jobs keep no 4-D output: grad_cam's reason is one line for all, not one per job."""
    _, page = reports["clip max x seed"]
    pictures = _section(page, "pictures")
    notes = re.findall(r'<p class="note">(not drawn[^<]*)</p>', pictures)
    assert notes and all(note.startswith("not drawn for any of these jobs: ") for note in notes)
    assert len(notes) == len(set(notes)) and any("grad_cam" in note for note in notes)
    assert pictures.rindex("<h3>") < pictures.index(notes[0])  # after the last job's pictures
