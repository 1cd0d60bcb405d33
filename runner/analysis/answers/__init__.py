"""What each hook type found, said once: the lines the terminal prints when a run ends, the first
screen of its report, and the table a user loads all come from one ``Answer`` per hook entry.

A hook type's answerer is a function ``(run_dir, entry) -> Answer | None`` named in ``ANSWERERS``
as ``"module:function"`` and imported only when a run of that type is summarized. ``None`` means the
entry's files hold nothing to answer with; the summary then says what the entry wrote.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Answer:
    """One entry's answer: ``lines`` for the terminal and the report's first screen (the first line
    is the headline), ``table`` the rows those lines were read from (a user can load it)."""

    lines: list[str]
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


#: Hook type -> "module:function" of its answerer.
ANSWERERS: dict[str, str] = {
    "units": "runner.analysis.answers.units:answer",
}


def answer_of(run_dir: str | Path, entry: str, hook_type: str) -> Answer | None:
    """The answer of hook ``entry`` (of type ``hook_type``) of the complete run at ``run_dir``; ``None``
    when its type has no answerer or its files hold nothing to answer with."""
    target = ANSWERERS.get(hook_type)
    if target is None:
        return None
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(Path(run_dir), entry)
