"""The text of README.md and the docs pages (docs/**/*.md), as the tests that run their examples read it.

A passage is named by its page and its heading (``section("how-to/replay.md", "Replay")``), so a test
follows the text when it moves; headings inside code blocks (a script's ``# train_ddp.py``) are not
headings. ``README.md`` is the page ``"README.md"``; every other page is named from ``docs/``.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HEADING = re.compile(r"(#{1,6}) (.+)")


def page(name: str) -> str:
    """A page's text: ``README.md`` or a path below ``docs/``."""
    path = ROOT / name if name == "README.md" else DOCS / name
    return path.read_text(encoding="utf-8")


def pages() -> dict[str, str]:
    """README.md and every docs page, by name, README first."""
    names = ["README.md", *sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))]
    return {name: page(name) for name in names}


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(line index, level, title)`` of every heading outside code fences."""
    found, fence = [], False
    for number, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := HEADING.fullmatch(line)):
            found.append((number, len(match.group(1)), match.group(2)))
    return found


def section(name: str, title: str) -> str:
    """The text under heading ``title`` of page ``name``, up to the next heading of its level or above."""
    lines = page(name).splitlines()
    marks = headings("\n".join(lines))
    for at, (number, level, heading) in enumerate(marks):
        if heading == title:
            end = next((n for n, lvl, _ in marks[at + 1:] if lvl <= level), len(lines))
            return "\n".join(lines[number + 1:end]) + "\n"
    raise KeyError(f"{name} has no heading {title!r}; it has {[h for _, _, h in marks]}")


def blocks(text: str, language: str) -> list[str]:
    """The ``language`` code blocks of ``text``, in order, as written."""
    return [part.split("```", 1)[0] for part in text.split(f"```{language}\n")[1:]]


def everything() -> str:
    """README.md and every docs page in one text, for claims that may stand on any page."""
    return "\n".join(pages().values())


#: A shell command's trailing comment: ``#`` after a space, then a space (``re:...\d+`` and ``'#'`` stay).
COMMENT = re.compile(r"\s+#\s.*$")
#: A ``$ python -m runner`` line a page shows failing: the command and the ``error:`` line under it.
SHOWN_FAILING = re.compile(r"^ *\$ (python -m runner [^\n]*)\n *(error: [^\n]*)$", re.M)
#: A command that stands for others: its placeholders are not values.
PLACEHOLDER = re.compile(r"\.\.\.|…|\b(ARGS|YOURS|NAME|RUN_DIR|DIR|PATH|FILE|SWEEP|RUN|JOBID|OVERRIDES)\b")


def normal(command: str) -> str:
    """A command as a shell reads it, for comparing: continuations joined, its comment and prompt dropped,
    runs of spaces one."""
    command = COMMENT.sub("", command.replace("\\\n", " ").strip().removeprefix("$ "))
    return " ".join(command.split())


def shell_commands() -> list[tuple[str, str]]:
    """``(page, command)`` for every shell command of README.md and the docs pages, in order, each once per page:
    every line of a ``bash`` block, every ``$ `` line of another block, every ``python -m runner`` code span of
    the prose; not those with placeholders (``JOBID``, ``...``), which stand for a command."""
    found = []
    for name, text in pages().items():
        for language, block in re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M):
            if language in ("python", "yaml", "toml", "json"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                if language == "bash" and line.strip() or line.strip().startswith("$ "):
                    found.append((name, normal(line)))
        prose = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
        found += [(name, normal(span[span.index("python -m runner "):]))
                  for span in re.findall(r"`([^`\n]*python -m runner [^`\n]*)`", prose)]
    return [(name, command) for name, command in dict.fromkeys(found) if not PLACEHOLDER.search(command)]
