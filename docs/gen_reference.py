"""MkDocs hook: the reference tables generated from the code when the site is built, so they cannot drift.

A page asks for a table with a marker line, replaced by ``on_page_markdown``:

- ``<!-- generated: hook-specs -->``: every hook type of ``hooks.mechanism.registry.HOOK_TYPES``, its docstring,
  the PyTorch hooks it registers and its spec's keys (type, default) beyond the keys every entry has;
- ``<!-- generated: config-groups -->``: every config group under ``conf/`` with each option's YAML,
  and the keys of the registered schema an option's ``kind``/name selects;
- ``<!-- generated: columns -->``: every file's columns, Arrow types and meanings from ``common.records``,
  with the ``#:`` comment that declares it;
- ``<!-- generated: model-sizes -->``: each model preset of ``conf/model/`` built (on the meta device, as the
  rehearsal builds it) and measured: its input, width, layers, heads, vocabulary or classes, parameters;
- ``<!-- generated: api-imports -->``: a mkdocstrings directive (``::: path``) for every function and class
  the pages' code imports (``page_imports``) that the API page's own directives do not show.

A key or column without a meaning (its ``#:`` comment) stops the build (``MissingMeaning``), so the reference
never shows a blank. ``python docs/gen_reference.py MARKER`` prints one of them (``tests/test_docs.py`` checks them).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _clean(doc: str | None) -> str:
    """A docstring as Markdown: dedented, reStructuredText's double backticks made single."""
    return inspect.cleandoc(doc or "").replace("``", "`")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
    else:
        return "required"
    return "required" if value == "???" else f"`{value!r}`"


def _type(field: dataclasses.Field) -> str:
    """A field's annotation as written, without ``|``, which would end a table cell."""
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", repr(field.type))
    return text.replace(" | ", " or ")


def _field_docs(schema: type) -> dict[str, str]:
    """The ``#:`` comment of each field, after it on its line or on the lines above it, over the class's bases."""
    docs: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#:"):
                above.append(stripped[2:].strip())
                continue
            if match := re.match(r"\s+(\w+)\s*:[^=#]*(?:=[^#]*)?(?:#:\s*(.*))?$", line):
                said = match.group(2) or " ".join(above)
                if said:
                    docs[match.group(1)] = said.replace("``", "`").replace("|", " or ")
            above = []
    return docs


class MissingMeaning(ValueError):
    """A key or column the reference would show without saying what it means."""


def _fields_table(fields: list[dataclasses.Field], schema: type) -> str:
    said = _field_docs(schema)
    missing = [f.name for f in fields if f.name not in said]
    if missing:
        raise MissingMeaning(f"{schema.__module__}.{schema.__qualname__}: no `#:` comment for {', '.join(missing)}")
    rows = [f"| `{f.name}` | `{_type(f)}` | {_default(f)} | {said[f.name]} |" for f in fields]
    return "\n".join(["| key | type | default | meaning |", "|---|---|---|---|", *rows])


def hook_specs() -> str:
    """Every registered hook type: docstring, PyTorch hooks, own keys."""
    import hooks  # noqa: F401  (registers every hook type)
    from hooks.mechanism.base import HookSpec
    from hooks.mechanism.registry import HOOK_TYPES

    common = [f.name for f in dataclasses.fields(HookSpec)]
    out = [f"Keys every entry has: {', '.join(f'`{name}`' for name in common)}. The keys below are each "
           "type's own (and those its family shares), with their types and defaults as the spec declares them."]
    for name in sorted(HOOK_TYPES):
        entry = HOOK_TYPES.get(name)
        out.append(f"\n### `{name}`\n")
        out.append(_clean(entry.build.__doc__) or "(no docstring)")
        pytorch = getattr(entry.build, "pytorch_hooks", None)
        if isinstance(pytorch, str):
            out.append(f"\nPyTorch hooks: {pytorch}")
        spec = entry.schema
        own = [f for f in dataclasses.fields(spec) if f.name not in common]
        out.append(f"\nSpec `{spec.__module__}.{spec.__qualname__}`:\n")
        out.append(_fields_table(own, spec) if own else "(no keys of its own)")
    return "\n".join(out) + "\n"


def _schema_of(group: str, option: dict) -> type | None:
    """The dataclass a config option is merged into: the ``/GROUP_schema/NAME@_here_`` it inherits, or
    the registered choice its ``kind`` / ``name`` names."""
    from runner.config import registry

    registries = {"model": (registry.MODELS, "name"), "data": (registry.DATA_KINDS, "kind"),
                  "loss": (registry.LOSSES, "name"), "optimizer": (registry.OPTIMIZERS, "name"),
                  "logger": (registry.LOGGERS, "name")}
    if group not in registries:
        return None
    chosen, key = registries[group]
    inherited = [re.fullmatch(r"/\w+_schema/(\w+)@_here_", str(d)) for d in option.get("defaults") or []]
    name = next((m.group(1) for m in inherited if m), option.get(key))
    if name is None or name not in chosen:
        return None
    return chosen.get(name).schema


def config_groups() -> str:
    """Every group under ``conf/``: its options, each option's YAML and its schema's keys."""
    import yaml

    import runner.sources  # noqa: F401  (registers the built-in models, data kinds, losses and optimizers)
    import runner.live  # noqa: F401  (registers the loggers)

    conf = ROOT / "conf"
    out = ["`conf/config.yaml`, the defaults every run composes:\n", "```yaml",
           (conf / "config.yaml").read_text().strip(), "```"]
    for group in sorted(p for p in conf.rglob("*") if p.is_dir() and any(p.glob("*.yaml"))):
        key = str(group.relative_to(conf))
        out.append(f"\n### `{key}`\n")
        for option in sorted(group.glob("*.yaml")):
            text = option.read_text().strip()
            out.append(f"**`{key}={option.stem}`** (`conf/{key}/{option.name}`)\n")
            out += ["```yaml", text, "```\n"]
            loaded = yaml.safe_load(text) or {}
            schema = _schema_of(key, loaded) if isinstance(loaded, dict) else None
            if schema is not None and dataclasses.is_dataclass(schema):
                out.append(f"Keys of `{schema.__qualname__}`:\n")
                out.append(_fields_table(list(dataclasses.fields(schema)), schema) + "\n")
    return "\n".join(out) + "\n"


BULLET = re.compile(r"- ``(\w+)``: (.*)")


def _declarations() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """From ``common/records.py``: the ``#:`` comment above each module-level name, and the columns its
    bullets (``#: - ``name``: meaning``, continued by indented ``#:`` lines) explain, by that name."""
    found, bullets, comment, columns = {}, {}, [], {}
    last = None
    for line in (ROOT / "common" / "records.py").read_text().splitlines():
        if line.startswith("#:"):
            text = line[2:].strip()
            if match := BULLET.fullmatch(text):
                last = match.group(1)
                columns[last] = match.group(2)
            elif last is not None and line[2:].startswith("   ") and text:
                columns[last] += " " + text
            else:
                comment.append(text)
                last = None
            continue
        if (match := re.match(r"([A-Z_]+)(?:: [^=]+)? = ", line)) and (comment or columns):
            found[match.group(1)] = " ".join(comment)
            bullets[match.group(1)] = columns
        if not line.startswith((" ", ")", "]")):
            comment, columns, last = [], {}, None
    return found, bullets


def _trailing() -> dict[str, str]:
    """The ``#:`` comment after each ``pa.field("name", ...)`` of ``common/records.py`` alone on its line."""
    text = (ROOT / "common" / "records.py").read_text()
    return dict(re.findall(r'^\s+pa\.field\("(\w+)".*?#:\s*(.+)$', text, re.M))


def columns() -> str:
    """Every file of a run directory that holds a table: its columns, Arrow types and meanings (the
    bullets above its schema; for the per-step tables the comment after each field as well)."""
    from common import records

    said, bullets = _declarations()
    trailing = _trailing()
    names = {id(value): name for name, value in vars(records).items() if name.endswith("_SCHEMA")}
    files = {**records.TABLE_SCHEMAS, **records.RUN_TOTAL_SCHEMAS}
    out, missing = [], []
    for file, schema in files.items():
        variable = names.get(id(schema), "")
        meaning = {**(trailing if file in records.TABLE_SCHEMAS else {}), **bullets.get(variable, {})}
        missing += [f"{file} {field.name}" for field in schema if field.name not in meaning]
        out.append(f"\n### `{file}`\n")
        if variable and (text := said.get(variable) or said.get(variable.removesuffix("_SCHEMA"))):
            out.append(text.replace("``", "`") + "\n")
        out.append(f"`common.records.{variable}`:\n")
        out += ["| column | Arrow type | meaning |", "|---|---|---|"]
        out += [f"| `{field.name}` | `{field.type}` | {_cell(meaning.get(field.name, ''))} |" for field in schema]
    if missing:
        raise MissingMeaning(f"common/records.py: no meaning for the columns {', '.join(missing)}")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """A meaning as one table cell: Markdown's single backticks, no ``|``."""
    return text.replace("``", "`").replace("|", " or ")


#: Model presets that build nothing by themselves (a Hugging Face folder, your own class): their sizes are yours.
UNSIZED = {"hf": "a saved Hugging Face model's: its `config.json`", "custom": "your class's"}


def _size_row(name: str) -> str:
    """One preset's row: the model its config builds, measured (a transformer's sizes from its ``config``)."""
    from runner.config.compose import compose_config
    from runner.engine.plan_cache import built_on_meta

    cfg = compose_config([f"model={name}"]).model
    model = built_on_meta(cfg)
    parameters = f"{sum(p.numel() for p in model.parameters()):,}"
    shape = f"`{list(cfg.input_shape)}`"
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "hidden_size"):
        return (f"| `{name}` | token ids {shape} | {config.hidden_size} | {config.num_hidden_layers} | "
                f"{config.num_attention_heads} | {config.vocab_size} (vocabulary) | "
                f"{config.max_position_embeddings} | {parameters} |")
    head = model.get_submodule(cfg.head) if cfg.head else model
    width = f"{head.in_features} (into `{cfg.head or '(model)'}`)"
    return f"| `{name}` | {shape} | {width} | - | - | {cfg.num_classes} (classes) | - | {parameters} |"


def model_sizes() -> str:
    """Every model preset's sizes, measured on the model its config builds."""
    import runner.sources  # noqa: F401  (registers the built-in models)

    names = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
    rows = [_size_row(name) for name in names if name not in UNSIZED]
    return "\n".join(["| preset | input (the preset's batch) | width (d_model; a vision model: features into its head) "
                      "| layers | heads | outputs | context | parameters |", "|---|---|---|---|---|---|---|---|",
                      *rows, "", *(f"`model={name}`: the sizes are {whose}." for name, whose in UNSIZED.items())]) + "\n"


#: The packages whose names the pages' code imports from (the API reference shows each).
PACKAGES = ("runner", "hooks", "common")
API_PAGE = "reference/api.md"
DIRECTIVE = re.compile(r"^::: ([\w.]+)$", re.M)


def _code_of_pages() -> list[str]:
    """The Python the pages show: README.md's and each docs page's ``python`` blocks, and each notebook."""
    docs = ROOT / "docs"
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in sorted(docs.rglob("*.md")))]
    code = [block for text in texts for block in re.findall(r"^ *```python\n(.*?)^ *```", text, re.S | re.M)]
    return code + [p.read_text() for p in sorted((docs / "notebooks").glob("*.py"))]


def _named(code: str) -> list[str]:
    """The dotted names of our packages ``code`` uses: ``from M import name`` (``M.name``), and the
    attributes it reads of a module it imported (``import runner.analysis as analysis``, then
    ``analysis.load_stats``: ``runner.analysis.load_stats``)."""
    try:
        tree = ast.parse(inspect.cleandoc(code))
    except SyntaxError:
        return []  # a fragment (``...`` standing for code): its names are shown elsewhere
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in PACKAGES:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``
                    bound[alias.asname or root] = alias.name if alias.asname else root
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (dotted := _dotted(node)):
            head, _, rest = dotted.partition(".")
            if head in bound:
                found.append(f"{bound[head]}.{rest}")
    return found


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of an attribute chain on a plain name, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _resolved(dotted: str) -> object | None:
    """The object ``dotted`` names, its modules imported on the way; ``None`` for an attribute of a value
    (``runner.attach(...).step``: not a name of the API)."""
    parts = dotted.split(".")
    value = importlib.import_module(parts[0])
    for at, part in enumerate(parts[1:], 2):
        if not hasattr(value, part) and inspect.ismodule(value):
            try:
                importlib.import_module(".".join(parts[:at]))
            except ImportError:
                return None
        value = getattr(value, part, None)
        if value is None or not (inspect.ismodule(value) or inspect.isclass(value) or inspect.isfunction(value)):
            return None
    return value


def page_imports() -> list[str]:
    """Where each function and class the pages' code names is defined (``module.qualname``), in order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    paths = []
    for dotted in (name for code in _code_of_pages() for name in _named(code)):
        value = _resolved(dotted)
        if inspect.isfunction(value) or inspect.isclass(value):
            paths.append(f"{value.__module__}.{value.__qualname__}")
    return list(dict.fromkeys(paths))


def shown_by(directives: list[str], path: str) -> bool:
    """Whether a page of ``:::`` ``directives`` shows ``path``: named itself, or a public, documented member
    of a module named (mkdocstrings-python shows those, within the module's ``__all__`` when it has one)."""
    module, _, name = path.rpartition(".")
    if path in directives:
        return True
    if module not in directives or name.startswith("_"):
        return False
    held = importlib.import_module(module)
    listed = getattr(held, "__all__", None)
    return (listed is None or name in listed) and bool(inspect.getdoc(getattr(held, name)))


def api_imports() -> str:
    """A directive for each function and class the pages import that the API page does not show otherwise."""
    directives = DIRECTIVE.findall((ROOT / "docs" / API_PAGE).read_text())
    missing = [path for path in page_imports() if not shown_by(directives, path)]
    return "\n\n".join(f"::: {path}" for path in missing) + "\n"


GENERATORS = {"hook-specs": hook_specs, "config-groups": config_groups, "columns": columns, "api-imports": api_imports,
              "model-sizes": model_sizes}


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by its generated text."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    """MkDocs' hook: expand the markers of each page."""
    return expand(markdown)


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
