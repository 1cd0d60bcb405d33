"""The docs as a whole: the site builds strict, every page is in its navigation, the README's own
examples run as written, every command line of every page passes the command line's check, and the
hand-written tables name what the registries hold.

The passages each tutorial and how-to guide shows run in their own tests (``tests/test_readme*.py``
and the feature tests), which read them through ``docs_text`` by page and heading.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import runner
import runner.analysis as analysis
from common.errors import OutputError
from docs_text import (DOCS, ROOT, SHOWN_FAILING, blocks, everything, headings, normal, page, pages, section,
                       shell_commands)
from runner.cli.commandline import check_command_line
from test_readme import COMMANDS as TABLE
from test_readme_twice import FIXED


@pytest.mark.docs_runs
def test_the_site_builds_strict():
    """The README's ``mkdocs build --strict ...`` as written: a broken link, anchor or API reference, or a page
    outside the nav, fails it; the notebooks are pages with their code."""
    (line,) = [line for line in blocks(section("README.md", "Tests"), "bash")[0].splitlines() if line.startswith("mkdocs ")]
    words = shlex.split(line, comments=True)
    site = Path(words[words.index("--site-dir") + 1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", *words], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="runner.engine.attach.attach"' in api and 'id="runner.analysis.load.load_stats"' in api
    imported = _gen_reference().page_imports()
    assert [path for path in imported if f'id="{path}"' not in api] == []  # each with its heading's anchor
    specs = (site / "reference" / "hook-types" / "index.html").read_text()
    assert "hooks.specs.gradients.ClampSpec" in specs  # the generated reference, expanded at build time
    for notebook in (DOCS / "notebooks").glob("*.py"):
        rendered = (site / "notebooks" / notebook.stem / "index.html").read_text()
        assert "runner</span><span class=\"o\">.</span><span class=\"n\">attach" in rendered, notebook.name
    assert not (ROOT / ".cache").exists()  # the build writes nothing into the checkout


def _nav_pages(nav) -> list[str]:
    found = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        found += _nav_pages(value) if isinstance(value, list) else [value]
    return found


def test_every_page_is_in_the_navigation_once_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    assert len(listed) == len(set(listed))
    notebooks = [str(p.relative_to(DOCS)) for p in (DOCS / "notebooks").glob("*.py")]
    assert sorted(listed) == sorted([name for name in pages() if name != "README.md"] + notebooks)


def test_every_link_of_the_readme_reaches_a_file():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page("README.md"))
    assert len(targets) > 20
    assert [t for t in targets if not t.startswith("http") and not (ROOT / t).is_file()] == []


def test_the_readmes_table_of_extras_says_what_each_adds():
    """Each row's "adds" column names the extra's requirements in pyproject.toml (and the extras it pulls in)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", section("README.md", "Install"), re.M)
    assert sorted(name for name, _ in rows) == sorted(extras)
    for name, adds in rows:
        named = re.findall(r"`([^`]+)`", adds)
        wanted = []
        for requirement in extras[name]:
            pulled = re.fullmatch(r"hook-runner\[(.*)\]", requirement)
            wanted += pulled.group(1).split(",") if pulled else [re.split(r"[<>=]", requirement)[0]]
        assert named == wanted, name


def test_the_readmes_attach_and_load_stats_examples_run_as_written(tmp_path, monkeypatch, capsys):
    attach, load = blocks(section("README.md", "In your own loop"), "python") + \
        blocks(section("README.md", "Reading what was recorded"), "python")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(attach, "README.md (In your own loop)", "exec"), scope)
    model = scope["model"]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # hooks left the model
    assert all(not p._backward_hooks for p in model.parameters() if p._backward_hooks is not None)
    assert len(analysis.load_steps(tmp_path / "runs" / "first")) == 3
    shown: dict = {}
    exec(compile(load, "README.md (Reading what was recorded)", "exec"), shown)
    maxima = shown["grads"].groupby(["layer", "slot"], observed=True)["max"].max()
    assert sorted(maxima.index) == [("0", "bias"), ("0", "weight"), ("2", "bias"), ("2", "weight")]
    assert ((maxima > 0) & (maxima <= 0.01 * (1 + 1e-7))).all()  # what the comment says: clipped
    assert str(maxima) in capsys.readouterr().out


def test_a_run_on_windows_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch):
    """What the README's "Supported platforms" says: the claim would call ``os.kill(pid, 0)``."""
    import torch

    from runner.store import lock

    monkeypatch.setattr(lock.sys, "platform", "win32")
    model = torch.nn.Linear(3, 2)
    with pytest.raises(OutputError) as refused:
        with runner.attach(model, hooks=["stats"], out_dir=tmp_path / "run"):
            model(torch.randn(2, 3))
    assert str(refused.value) == lock.WINDOWS and "\n" not in lock.WINDOWS
    assert "Windows" in section("README.md", "Supported platforms") and "os.kill(pid, 0)" in lock.WINDOWS
    assert not (tmp_path / "run" / "manifest.json").exists() and not model._forward_hooks


#: Commands whose overrides name what an earlier command of their page made (a stored run, a folder):
#: their page's own test runs them in order (tests/test_readme_patching.py, ..._steering.py, ...).
NEEDS_EARLIER = re.compile(r"\b(source|positive|negative|replay|model\.path)=(?!clean\b)|data\.path=\S*crops|resume=")


def runner_commands() -> list[tuple[str, str]]:
    """``(page, command)`` for every ``python -m runner`` command of every page (``docs_text.shell_commands``)
    but those a page shows failing (an ``error:`` line follows them)."""
    failing = {normal(command) for command, _ in SHOWN_FAILING.findall(everything())}
    return [(name, command) for name, command in shell_commands()
            if command.startswith("python -m runner ") and command not in failing]


#: The commands that stand alone, each composed and planned here in well under a second: a typo fails here even
#: in a command whose run is slow or marked (each runs as written: tests/test_docs_commands.py says where).
COMMANDS = [(name, command) for name, command in runner_commands()
            if not NEEDS_EARLIER.search(command) and command not in TABLE and not FIXED.search(command)]


def test_the_pages_have_command_lines_to_check():
    every = runner_commands()
    assert len(every) >= 60 and len(COMMANDS) >= 12
    assert {name for name, _ in COMMANDS} >= {"README.md", "how-to/sweeps.md", "how-to/analysis.md",
                                              "reference/hook-types.md", "tutorials/classic-hooks.md"}


@pytest.mark.parametrize("name, command", COMMANDS, ids=[f"{n}: {c[17:70]}" for n, c in COMMANDS])
def test_every_command_line_of_the_docs_passes_the_command_lines_check(name, command, monkeypatch):
    """Each as written from the repository root (``assets/`` there), every job composed and its plan
    compiled on the meta device: a typo in a key, a value or a layer fails here."""
    words = shlex.split(command)
    if words[3].startswith("runner."):  # python -m runner.report ...: a tool over a run, not a run
        pytest.skip("not a run")
    monkeypatch.chdir(ROOT)
    checked = check_command_line([w for w in words[3:] if not w.startswith(("hydra.run.dir=", "hydra.sweep.dir="))])
    assert checked.problems == [], (name, command)


def test_the_hook_types_table_names_every_registered_type_and_the_error_line_lists_them():
    import hooks  # noqa: F401  (registers every hook type)
    from hooks.mechanism.registry import HOOK_TYPES

    table = section("reference/hook-types.md", "Hook types")
    rows = re.findall(r"^\| \[`(\w+)`\]\(#\1\) \|", table, re.M)  # each linking to its spec's heading
    assert sorted(rows) == sorted(HOOK_TYPES)
    for name in ("README.md", "index.md"):
        listed = re.search(r"unknown hook type 'clmap'; valid: (.*?); did you mean", page(name)).group(1)
        assert listed.split(", ") == sorted(HOOK_TYPES), name


def test_the_hook_types_table_breaks_no_name_inside_a_word():
    """At 1,280 px the five-column table broke `edit_output` as `edit_outpu` / `t` (Material breaks code
    anywhere). The site's stylesheet keeps a table's code spans whole, and the table has four columns
    (the keys are in each type's spec, which its name links to), none holding an unbroken run of code
    wider than the longest PyTorch hook name. (Looked at in headless Chromium at 1,280 px.)"""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (sheet,) = config["extra_css"]
    css = " ".join((DOCS / sheet).read_text().split())
    assert re.search(r"\.md-typeset table:not\(\[class\]\) code \{ word-break: normal; \}", css), css
    text = section("reference/hook-types.md", "Hook types")
    table = re.search(r"^\| type \|.*?\n(?=[^|])", text, re.S | re.M).group(0).splitlines()  # the first table
    assert {line.count(" | ") for line in table if not line.startswith("|-")} == {3}  # four cells a row
    spans = re.findall(r"`([^`]*)`", "\n".join(table))
    assert max(len(word) for span in spans for word in span.split()) <= len("Tensor.register_post_accumulate_grad_hook")


def _size_rows() -> dict[str, list[str]]:
    """The generated sizes table, by preset: its cells without backticks."""
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", _gen_reference().model_sizes(), re.M)
    return {name: [cell.replace("`", "") for cell in cells.split(" | ")] for name, cells in rows}


def test_each_model_preset_s_sizes_are_the_real_model_s():
    """Every preset of conf/model (but hf and custom, whose sizes are the user's) has a row whose numbers are
    those of the model built the plain way (on the CPU, by its own constructor): its input runs through it,
    the width is what its head reads (d_model), a transformer's layers, heads, vocabulary and context are
    its modules', and the parameters are counted once each; the steering page's width of gpt2_tiny is its row's."""
    import torchvision
    from torch import nn

    from runner.sources.models import ConvNet, DigitsCNN, MLP, gpt2_tiny

    rows = _size_rows()
    assert set(rows) == {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")} - {"hf", "custom"}
    built = {"convnet": ConvNet(), "digits_cnn": DigitsCNN(), "linear": nn.Linear(3, 3), "mlp": MLP(),
             **{name: getattr(torchvision.models, name)() for name in ("resnet18", "resnet34", "resnet50")}}
    for name, model in built.items():
        shape, width, layers, heads, outputs, context, parameters = rows[name]
        head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():  # the preset's input runs through it (one sample of it: the same shape per sample)
            out = model(torch.zeros([1, *yaml.safe_load(shape)[1:]]))
        assert out.shape[-1] == head.out_features == int(outputs.split()[0]), name
        assert int(width.split()[0]) == head.in_features, name
        assert (layers, heads, context) == ("-", "-", "-"), name
        assert int(parameters.replace(",", "")) == sum(p.numel() for p in model.parameters()), name
    gpt2 = gpt2_tiny()
    shape, width, layers, heads, outputs, context, parameters = rows["gpt2_tiny"]
    blocks = gpt2.transformer.h
    assert int(width) == gpt2.transformer.wte.embedding_dim == blocks[0].attn.embed_dim
    assert (int(layers), int(heads)) == (len(blocks), blocks[0].attn.num_heads)
    assert int(outputs.split()[0]) == gpt2.lm_head.out_features and int(context) == gpt2.transformer.wpe.num_embeddings
    assert int(parameters.replace(",", "")) == sum(p.numel() for p in gpt2.parameters())
    assert shape.startswith("token ids ")
    assert f"`gpt2_tiny`: {width};" in page("tutorials/steering.md")


def test_dated_measurements_are_on_one_page_newest_first_and_performance_keeps_the_current_numbers():
    """The performance page explains and holds the current numbers, linking the measurements page; the
    measurements page holds every dated run, newest first (no engineering log on the explanation page)."""
    performance = page("explanation/performance.md")
    assert "Measured again" not in performance and "(measurements.md)" in performance
    dated = [title for _, level, title in headings(page("explanation/measurements.md"))
             if level == 2 and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d", title)]
    assert len(dated) >= 6 and dated == sorted(dated, reverse=True)
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert "explanation/measurements.md" in _nav_pages(nav)


def test_the_changelog_is_release_notes_of_the_package_s_version():
    """Grouped by version (the package's own first), then by kind of change: not a list of commits by day."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    marks = headings(page("explanation/changelog.md"))
    versions = [title for _, level, title in marks if level == 2]
    assert versions and versions[0].split()[0] == version
    assert {title for _, level, title in marks if level == 3} <= {"Added", "Changed", "Fixed", "Removed", "Performance"}
    assert not re.search(r"^## \d{4}-\d\d-\d\d", page("explanation/changelog.md"), re.M)


def test_the_configuration_table_names_every_preset_of_conf():
    """(The hooks row: tests/test_readme_twice.py.)"""
    table = section("reference/configuration.md", "Configuration")
    for group in ("model", "data", "loss", "optimizer"):
        row = re.search(rf"^\| `{group}` \| (.*) \|$", table, re.M).group(1)
        named = set(re.findall(r"`(\w+)`", row))
        presets = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert presets - named == set(), group


def _gen_reference():
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    return gen_reference


#: Functions the tutorials import that the API reference once left out.
LEFT_OUT = ["runner.analysis.patching_plots.patching_heatmap", "runner.analysis.unit_plots.layer_histograms",
            "runner.analysis.unit_plots.top_images_of_run", "runner.analysis.answers.dla.dla_table"]


def test_the_api_reference_shows_every_function_and_class_the_pages_import():
    """The API page as built (its ``:::`` directives, the generated ones included) shows each name the pages'
    code imports (``from runner.plots import ...``, or ``runner.plots.NAME`` after ``import runner.plots``)."""
    gen_reference = _gen_reference()
    imported = gen_reference.page_imports()
    assert set(LEFT_OUT) <= set(imported)  # found through both kinds of import (patching.md: import runner.plots)
    directives = gen_reference.DIRECTIVE.findall(gen_reference.expand(page("reference/api.md")))
    assert [path for path in imported if not gen_reference.shown_by(directives, path)] == []


def test_a_name_a_page_imports_that_no_directive_shows_is_added_to_the_api_page(tmp_path, monkeypatch):
    """A page importing a function the hand-written directives do not show: the generated section names it."""
    gen_reference = _gen_reference()
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    (tmp_path / "docs" / "notebooks").mkdir()
    (tmp_path / "README.md").write_text("```python\nfrom runner.analysis.units import top_units\n"
                                        "import runner.plots\nrunner.plots.save_png(None, 'x.png')\n```\n")
    (tmp_path / "docs" / "reference" / "api.md").write_text("::: runner.analysis.units\n")
    monkeypatch.setattr(gen_reference, "ROOT", tmp_path)
    assert gen_reference.api_imports() == "::: runner.analysis.plots.save_png\n"


def test_the_generated_reference_expands_every_marker():
    """Each marker a page holds has a generator, and what it gives names what the code declares."""
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    from common import records

    markers = {m for text in pages().values() for m in gen_reference.MARKER.findall(text)}
    assert markers == set(gen_reference.GENERATORS)
    columns = gen_reference.columns()
    for file, schema in {**records.TABLE_SCHEMAS, **records.RUN_TOTAL_SCHEMAS}.items():
        part = columns.split(f"### `{file}`", 1)[1].split("\n### ", 1)[0]
        assert re.findall(r"^\| `(\w+)` \|", part, re.M) == schema.names, file
    groups = gen_reference.config_groups()
    assert [p for p in (ROOT / "conf").rglob("*.yaml")
            if p.name != "config.yaml" and f"(`conf/{p.relative_to(ROOT / 'conf')}`)" not in groups] == []


def test_the_readme_is_a_front_page():
    assert len(page("README.md").splitlines()) <= 220


def test_the_reference_refuses_a_key_or_column_without_a_meaning(tmp_path, monkeypatch):
    """Every key and column has its ``#:`` meaning (the generators raise otherwise, which fails the build);
    a column whose bullet is gone, or a key without a comment, is named."""
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    for generate in (gen_reference.hook_specs, gen_reference.config_groups, gen_reference.columns):
        assert "|  |" not in generate()  # no empty cell
    (tmp_path / "common").mkdir()
    records = (ROOT / "common" / "records.py").read_text()
    bullet = "#: - ``target_rank``: "
    assert records.count(bullet) == 1
    (tmp_path / "common" / "records.py").write_text(
        "\n".join(line for line in records.splitlines() if not line.startswith(bullet)))
    monkeypatch.setattr(gen_reference, "ROOT", tmp_path)
    with pytest.raises(gen_reference.MissingMeaning, match=r"lens\.parquet target_rank$"):
        gen_reference.columns()
    (tmp_path / "plain_spec.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Plain:\n"
                                             "    said: int = 0  #: a meaning\n    unsaid: int = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from plain_spec import Plain

    with pytest.raises(gen_reference.MissingMeaning, match=r"plain_spec\.Plain: no `#:` comment for unsaid$"):
        gen_reference._fields_table(list(dataclasses.fields(Plain)), Plain)
