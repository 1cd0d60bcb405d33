"""Every shell command of README.md and the docs pages runs as written in a test.

``RUN_BY`` names, for each test that runs docs commands, the commands it runs (read from the same
passage, list or constant the test reads); ``CANNOT_RUN`` names the few that cannot run here, each
with its reason. ``test_every_docs_command_runs_in_a_test`` fails when a page gains a command that
neither holds. The commands no other test ran run here: the quick ones in-process (``runpy``, as
``python -m`` runs a module) from a directory like the repository root, the sweeps under ``slow``,
TensorBoard's server under ``tracking``.
"""
from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import runner.analysis as analysis
from docs_text import SHOWN_FAILING, blocks, everything, normal, page, section, shell_commands
from picture_content import assert_gradcam_run_pictures
from test_readme import COMMANDS as TABLE
from test_readme_twice import COMMANDS as TWICE

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
DOCS = shell_commands()


def bash_lines(name: str, heading: str | None = None, which: slice = slice(None)) -> list[str]:
    """The commands of a page's (or one section's) ``bash`` blocks (those ``which`` selects), continuations joined."""
    text = page(name) if heading is None else section(name, heading)
    return [line for block in blocks(text, "bash")[which] for line in block.replace("\\\n", " ").splitlines()
            if line.strip()]


def one(name: str, pattern: str) -> list[str]:
    """The one command of page ``name`` that ``pattern`` finds (what a test that hard-codes its reading finds)."""
    (found,) = [command for page_name, command in DOCS if page_name == name and re.search(pattern, command)]
    return [found]


def shown_failing() -> list[tuple[str, str]]:
    """``(command, its error line)`` for every ``$ python -m runner`` a page shows failing at once (not those
    shown failing "the second time": tests/test_readme_twice.py runs them)."""
    return [(normal(command), line) for command, line in dict.fromkeys(SHOWN_FAILING.findall(everything()))
            if not re.search(r"hydra\.(run|sweep)\.dir=", command)]


#: The commands that run here, quick, in-process: what each gives is checked in QUICK_CHECKS.
QUICK = one("explanation/performance.md", r"hooks=none model=convnet$") + \
    one("how-to/analysis.md", r"gradcam") + one("how-to/analysis.md", r"resnet50 hooks=stats") + \
    one("reference/hook-types.md", r"prepend=true") + one("reference/hook-types.md", r"\\d\+\\\.mlp") + \
    one("tutorials/classic-hooks.md", r"plan=true")
#: What "Load, draw and report" and "Live dashboards" do with a sweep Hydra wrote to its default, dated directory.
OF_A_SWEEP = one("how-to/analysis.md", r"^python -m runner\.report ") + \
    one("how-to/live-dashboards.md", r"^python -m runner\.tensorboard_export ")
SERVER = one("how-to/live-dashboards.md", r"^tensorboard --logdir ")
SWEEPS = bash_lines("how-to/sweeps.md", "Sweeps", slice(0, 1)) + one("how-to/sweeps.md", r"hydra/launcher=joblib")


def _slurm_part() -> list[str]:
    import test_slurm
    from slurm_cluster import SCRIPT

    return [test_slurm.README_SWEEP, SCRIPT, f"{SCRIPT} status", f"{SCRIPT} stop"]  # the fixture runs the script's


def _live_dashboards() -> list[str]:
    from test_loggers_tracking import live_dashboards_commands

    return live_dashboards_commands()


#: ``"file::test": commands it runs as written`` (a function: read when checked). Where a test's own module
#: reads the docs by pattern and runs what it finds, the same pattern finds it here (``one``).
RUN_BY = {
    "test_readme.py::test_tutorial_command_runs_as_written_and_gives_what_its_row_says": lambda: TABLE,
    "test_readme_twice.py::test_a_readme_command_run_twice_is_refused_with_the_documented_line": lambda: TWICE,
    "test_summary.py::test_the_front_pages_show_what_the_run_prints":
        lambda: one("README.md", r"^python -m runner model=convnet 'hooks=\[clip,stats\]'$"),
    "test_readme_patching.py::test_attribution_and_path_tables_are_the_hand_computed_ones_and_what_the_readme_states":
        lambda: bash_lines("tutorials/patching.md"),
    "test_readme_steering.py::test_the_steering_sweep_runs_as_written_and_scale_0_changes_nothing":
        lambda: bash_lines("tutorials/steering.md"),
    "test_readme_whole_datasets.py::test_the_three_workflows_run_as_written": lambda: bash_lines("tutorials/units.md"),
    "test_family_tutorial.py::test_the_three_family_sweep_runs_as_written_and_its_table_and_picture_are_plain_hooks_numbers":
        lambda: bash_lines("tutorials/families.md"),
    "test_dla.py::test_the_how_to_s_command_runs_as_written_and_prints_the_answer_it_shows":
        lambda: bash_lines("how-to/direct-logit-attribution.md"),
    "test_sae_readme.py::test_the_story_s_commands_run_as_written_and_name_the_hand_computed_top_prompts":
        lambda: bash_lines("tutorials/sae.md", "A feature's top prompts, then the text it steers"),
    "test_transcoder_docs.py::test_the_page_s_commands_run_as_written_and_give_what_it_says":
        lambda: bash_lines("how-to/transcoders.md"),
    "test_graph_docs.py::test_the_page_s_commands_run_as_written_and_give_what_it_says":
        lambda: bash_lines("tutorials/attribution-graphs.md"),
    "test_graph_json.py::test_the_how_to_s_commands_run_as_written_and_give_what_it_says":
        lambda: bash_lines("how-to/graph-json.md"),
    "test_generation_answers.py::test_the_how_to_page_s_command_runs_as_written_and_prints_what_the_page_shows":
        lambda: bash_lines("how-to/generation.md"),
    "test_readme_whole_datasets.py::test_the_sharded_sweep_runs_as_written_on_slurm":
        lambda: one("how-to/whole-datasets.md", r"hydra/launcher=slurm_cpu"),
    "test_readme_whole_datasets.py::test_units_and_a_store_under_torchrun_merge_to_the_one_process_run":
        lambda: one("how-to/whole-datasets.md", r"^torchrun ") + one("how-to/whole-datasets.md", r"^python units_ranks"),
    "test_sweep_resume.py::test_ctrl_c_mid_job_stops_the_sweep_and_resume_finishes_it":  # in its own sweep directory
        lambda: [normal(c) for c in re.findall(r"^\$ (.*)$", section("how-to/resume.md", "Stop and resume a sweep"), re.M)],
    "test_slurm.py::test_the_readme_sweep_runs_four_jobs_on_slurm_cpu_and_loads_as_one_table": _slurm_part,
    "test_loggers_tracking.py::test_the_readmes_live_dashboards_commands_run_as_written": _live_dashboards,
    "test_fsdp_cli.py::test_the_readme_command_gives_each_rank_the_rows_of_the_unsharded_run":
        lambda: one("how-to/big-models.md", r"^torchrun --nproc_per_node=2 -m runner "),
    "test_integrations_lightning_fsdp.py::test_each_rank_of_a_lightning_fsdp2_fit_records_what_the_unsharded_fit_records":
        lambda: one("how-to/big-models.md", r"lightning_fsdp_cases\.py"),
    "test_device_map.py::test_the_readme_device_map_command_records_what_the_whole_model_records":
        lambda: one("how-to/big-models.md", r"model\.device_map="),
    "test_distributed.py::test_the_readme_torchrun_example_gives_one_table_with_each_ranks_own_numbers":
        lambda: one("how-to/own-model.md", r"train_ddp\.py"),
    "test_benchmarks.py::test_quick_benchmark_writes_every_table":  # bench.main(["--quick", "--out", tmp])
        lambda: one("explanation/performance.md", r"benchmarks\.run --quick$"),
    "test_docs.py::test_the_site_builds_strict": lambda: one("README.md", r"^mkdocs build "),
    "test_docs_commands.py::test_a_command_shown_failing_prints_the_line_shown": lambda: [c for c, _ in shown_failing()],
    "test_docs_commands.py::test_a_quick_command_runs_as_written_and_gives_what_its_page_says": lambda: QUICK,
    "test_docs_commands.py::test_the_report_and_the_export_of_a_dated_sweep_run_as_written": lambda: OF_A_SWEEP,
    "test_docs_commands.py::test_tensorboard_serves_the_exported_sweep_as_written": lambda: SERVER,
    "test_docs_commands.py::test_the_sweeps_of_sweeps_md_run_as_written": lambda: SWEEPS,
}

#: Commands no test runs, and why.
SUITE = "the test suite itself: .ci/run runs these lines (tests/test_readme.py::test_ci_runs_exactly_the_readmes_test_commands)"
CANNOT_RUN = {
    "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu":
        "downloads about 200 MB from PyTorch's index into the environment the tests run in (tests/test_install.py "
        "checks the versions are the newest the pins allow)",
    "pip install -e .": "installs into the environment the tests run in (tests/test_install.py checks that what it "
                        "installs covers every import and runs the core example with everything else unimportable)",
    "pip install -e '.[test]' && python -m pytest -q -n 2 --dist loadfile": SUITE,
    'CC=/nonexistent/cc HOOK_RUNNER_CACHE=/tmp/no-cc python -m pytest -q -n 2 --dist loadfile -m "statistics and not (slow or slurm or torchrun or compiled or soak or tracking or sae or oracles or docs_runs)"': SUITE,
    "python -m pytest -q -n 2 --dist loadfile -m slow": SUITE,
    "python -m pytest -q -n 2 --dist loadfile -m docs_runs": SUITE,
    "python -m pytest -q -m slurm": SUITE,
    "python -m pytest -q -m torchrun": SUITE,
    "python -m pytest -q -m compiled": SUITE,
    "python -m pytest -q -m soak": SUITE,
    "python -m pytest -q -m tracking": SUITE,
    "HOOK_RUNNER_CIRCUIT_TRACER_PYTHON=/tmp/venv-ct/bin/python HOOK_RUNNER_NNTERP_PYTHON=/tmp/venv-nnterp/bin/python python -m pytest -q -m oracles": SUITE,
    "scripts/make-peer-env.sh /tmp/venv-nnterp 'nnterp==1.3.*' 'nnsight>=0.6,<0.7'": SUITE,
    "scripts/test-in-clone-venv.sh tests/test_hot_path.py tests/test_long_lived.py tests/test_parameter_path.py": SUITE,
    "scripts/make-peer-env.sh /tmp/venv-sae 'sae-lens>=6,<7'": SUITE,
    "HOOK_RUNNER_SAE_PYTHON=/tmp/venv-sae/bin/python python -m pytest -q -m sae": SUITE,
    "scripts/make-peer-env.sh /tmp/venv-ct 'circuit-tracer==0.5.*'": SUITE,
    "python -m benchmarks.run": "a benchmark: minutes of timed runs a shared machine makes noise of (--quick runs)",
    "python -m benchmarks.run --resnet50": "a benchmark: minutes of timed runs (--quick runs)",
    "python -m benchmarks.run --long": "a benchmark: a 10,000-job sweep to load, timed (--quick runs)",
    "python -m benchmarks.startup --rounds 8": "a benchmark: 8 timed start-ups of the CLI",
}


def _defined(node: str) -> bool:
    file, test = node.split("::")
    return re.search(rf"^def {test}\(", (ROOT / "tests" / file).read_text(), re.M) is not None


def test_every_docs_command_runs_in_a_test():
    """A command a page gains fails here until a test runs it (and is named in RUN_BY) or CANNOT_RUN says why not."""
    assert len(DOCS) >= 90
    assert [node for node in RUN_BY if not _defined(node)] == []
    ran = {node: [normal(command) for command in commands()] for node, commands in RUN_BY.items()}
    assert [node for node, commands in ran.items() if not commands] == []
    covered = set().union(*ran.values())
    assert [(name, command) for name, command in DOCS if command not in covered | set(CANNOT_RUN)] == []
    commands = {command for _, command in DOCS}
    assert [command for command in CANNOT_RUN if command not in commands or command in covered] == []  # none stale


def python_m(command: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """``python -m MODULE ARGS`` in this process, as ``python -m`` runs it: status, stdout, stderr."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"], command
    monkeypatch.setattr(sys, "argv", [words[2], *words[3:]])
    capsys.readouterr()
    try:
        runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def like_root(tmp_path, monkeypatch) -> Path:
    """A fresh working directory like the repository root the pages' commands run from (its ``assets/``)."""
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _startup_run(run_dir, out, shown):
    assert analysis.load_stats(run_dir).empty and len(analysis.load_steps(run_dir)) == 1  # no hook: nothing recorded


def _grad_cam_pictures(run_dir, out, shown):
    """The five pictures, each showing its data (``tests/picture_content.py`` reads them back from their pixels):
    catches a blank or missing picture, a panel or line left out, channels out of order, a Grad-CAM map not of
    the kept output and gradient, an input image not the house."""
    written = sorted(p.name for p in run_dir.glob("*.png"))
    assert written == ["feature_maps_conv1.png", "feature_maps_layer4.png", "grad_cam_conv1.png", "grad_cam_layer4.png",
                       "gradient_flow.png"]
    assert_gradcam_run_pictures(run_dir, ROOT / "assets" / "house.png")


def _resnet50_gradients_grow_back_to_conv1(run_dir, out, shown):
    """"the output-gradient std grows by about two decades from ``avgpool`` back to ``conv1`` (``fc``'s output
    gradient is all ones, its std 0)"."""
    grads = analysis.load_stats(run_dir, filters=[("kind", "=", "grad_output")]).drop_duplicates("layer")
    std = grads.set_index("layer")["std"]
    assert std["fc"] == 0 and 30 <= std["conv1"] / std["avgpool"] <= 300


def _prepend_override(run_dir, out, shown):
    """``hooks.clip.prepend=true`` overrides a key the preset does not list, without ``+``."""
    import yaml

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["hooks"]["clip"]["prepend"] is True


def _mlp_blocks_of_gpt2_tiny(run_dir, out, shown):
    stats = analysis.load_stats(run_dir)
    assert set(stats.layer) == {"transformer.h.0.mlp", "transformer.h.1.mlp"}  # "a 2-block GPT-2"


def _plan_printed(run_dir, out, shown):
    """The plan's lines the page shows after its ``...`` are what the command prints, and it ran nothing."""
    tail = shown.split("...\n", 1)[1].rstrip("\n")
    assert out.rstrip("\n").endswith(tail) and run_dir is None


#: What each quick command gives, as its page says, by the words that tell it apart.
QUICK_CHECKS = {"hooks=none model=convnet": _startup_run, "gradcam": _grad_cam_pictures,
                "resnet50 hooks=stats": _resnet50_gradients_grow_back_to_conv1, "prepend=true": _prepend_override,
                r"\.mlp": _mlp_blocks_of_gpt2_tiny, "plan=true": _plan_printed}


@pytest.mark.parametrize("command", QUICK, ids=[c[len("python -m runner "):][:50] for c in QUICK])
def test_a_quick_command_runs_as_written_and_gives_what_its_page_says(command, like_root, monkeypatch, capsys):
    (check,) = [check for words, check in QUICK_CHECKS.items() if words in command]
    code, out, err = python_m(command, monkeypatch, capsys)
    assert code == 0, err[-2000:]
    runs = list((like_root / "outputs").rglob("manifest.json"))
    shown = next((block for block in blocks(page("tutorials/classic-hooks.md"), "") if command in block), "")
    check(runs[0].parent if runs else None, out, shown)


@pytest.mark.parametrize("command, line", shown_failing(), ids=[c[len("python -m runner "):][:50] for c, _ in
                                                                 shown_failing()])
def test_a_command_shown_failing_prints_the_line_shown(command, line, like_root, monkeypatch, capsys):
    """Status 2, the one line the page shows, nothing written."""
    assert python_m(command, monkeypatch, capsys) == (2, "", line + "\n")
    assert sorted(p.name for p in like_root.iterdir()) == ["assets"]


@pytest.mark.docs_runs
def test_the_report_and_the_export_of_a_dated_sweep_run_as_written(like_root, monkeypatch, capsys):
    """The dated directory is what Hydra names a sweep by default; a two-job sweep is made there first. A second
    export replaces each job's event file (TensorBoard would show every step twice beside an old one)."""
    dated = Path(shlex.split(OF_A_SWEEP[0])[3])
    assert shlex.split(OF_A_SWEEP[1])[3] == str(dated)
    made = python_m(f"python -m runner -m model=mlp hooks=stats steps=2 seed=0,1 hydra.sweep.dir={dated}",
                    monkeypatch, capsys)
    assert made[0] == 0, made[2]
    for _ in range(2):  # they name a fixed directory: twice in a row, the second replaces what the first wrote
        report, export = (python_m(command, monkeypatch, capsys) for command in OF_A_SWEEP)
        assert report[0] == 0 and export[0] == 0, (report[2], export[2])
        html = (dated / "report.html").read_text()
        assert "seed=0" in html and "seed=1" in html
        assert export[1].splitlines() == [f"wrote {dated / str(job) / 'tensorboard'}" for job in (0, 1)]
        assert [len(list((dated / str(job) / "tensorboard").glob("events.out.tfevents.*"))) for job in (0, 1)] == [1, 1]


@pytest.mark.tracking
def test_tensorboard_serves_the_exported_sweep_as_written(like_root, monkeypatch, capsys):
    """The server the page starts answers with the sweep's runs (its port, 6006, as written)."""
    (command,) = SERVER
    dated = Path(shlex.split(command)[2])
    assert python_m(f"python -m runner -m model=mlp hooks=stats steps=2 seed=0,1 hydra.sweep.dir={dated}",
                    monkeypatch, capsys)[0] == 0
    assert python_m(OF_A_SWEEP[1], monkeypatch, capsys)[0] == 0
    server = subprocess.Popen(shlex.split(command), cwd=like_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, runs = time.monotonic() + 120, None
        while runs is None:
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read().decode()[-2000:]
            try:
                runs = urllib.request.urlopen("http://localhost:6006/data/runs", timeout=5).read().decode()
            except OSError:
                time.sleep(1)
        assert sorted(re.findall(r'"([^"]+)"', runs)) == ["0/tensorboard", "1/tensorboard"]
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_the_sweeps_of_sweeps_md_run_as_written(tmp_path):
    """Each of "Sweeps"' commands in a shell, as written; each job's overrides are its own combination."""
    expected = [4, 12, 2]  # hooks x models; 3 bounds x 4 seeds; 2 bounds on joblib
    assert len(SWEEPS) == len(expected)
    for command, jobs in zip(SWEEPS, expected):
        where = tmp_path / str(SWEEPS.index(command))
        where.mkdir()
        done = subprocess.run(["bash", "-c", command.replace("python", sys.executable, 1)], cwd=where,
                              capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-2000:]
        steps = analysis.load_steps(where / "outputs" / "multirun")
        assert steps.run_dir.nunique() == jobs, command
