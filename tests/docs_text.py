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
