"""What each hook type found, said once: the lines the terminal prints when a run ends, the first
screen of its report, and the table a user loads all come from one ``Answer`` per hook entry.

A hook type declares its answerer with its spec (``HookSpec.answers``, in ``hooks/specs/``): a function
``(run_dir, entry) -> Answer | None`` named as ``"module:function"`` and imported only when a run of that
type is summarized; a mode declares the answer of its own rows where modes are declared
(``runner.config.schema.MODE_ANSWERS``: ``mode=generate``'s generated text). Nothing here knows a type by
its name: a type added in its own module, with its own answerer, is answered with no file here touched.
A type without one, or whose answerer finds nothing to answer with (``None``), is answered by the statistics
the entry recorded (``RECORDED``); ``None`` from that too means the entry recorded no statistic row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from common.registry import imported
from hooks.specs import HOOK_TYPES, Answers
from runner.config.schema import MODE_ANSWERS


@dataclass(frozen=True)
class Answer:
    """One entry's answer: ``lines`` for the terminal and the report's first screen (the first line
    is the headline), ``table`` the rows those lines were read from (a user can load it)."""

    lines: list[str]
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


#: The answer of every other entry: what it recorded in ``stats.parquet``.
RECORDED = "runner.analysis.answers.statistics:recorded_answer"


def declared_answers(kind: str) -> Answers:
    """What ``kind`` declares it answers with: a mode's pseudo-entry (``MODE_ANSWERS``), else a hook type (its
    spec's ``answers``); a type this process does not know (a user's module not imported) declares nothing."""
    if kind in MODE_ANSWERS:
        return MODE_ANSWERS[kind]
    schema = HOOK_TYPES.schema_of(kind)
    return schema.answers if schema is not None else Answers()


def answer_of(run_dir: str | Path, entry: str, hook_type: str) -> Answer | None:
    """The answer of hook ``entry`` (of type ``hook_type``) of the complete run at ``run_dir``: its type's
    answerer's, else ``RECORDED``'s; ``None`` when neither finds anything to answer with."""
    target = declared_answers(hook_type).run
    answer = imported(target)(Path(run_dir), entry) if target else None
    return answer if answer is not None else imported(RECORDED)(Path(run_dir), entry)


def sweep_answer_of(path: str | Path, types: dict[str, str], corrupted: str | Path | None = None,
                    on_corrupt: str = "error") -> Answer | None:
    """The answer of the sweep at ``path`` whose jobs' entries are ``types`` (``{entry: hook type}``), from each
    type's declared sweep answerer (one answerer called once however many entries name it); ``None`` when no
    entry's type has one or its runs hold nothing to answer with; ``on_corrupt`` as for ``load_stats``."""
    sweeps = {entry: declared_answers(kind).sweep for entry, kind in types.items()}
    targets = {target: entry for entry, target in sweeps.items() if target is not None}
    answers = [imported(target)(Path(path), entry, corrupted, on_corrupt) for target, entry in targets.items()]
    answers = [answer for answer in answers if answer is not None]
    if not answers:
        return None
    return Answer([line for answer in answers for line in answer.lines], answers[0].table)
