"""What each hook type found, said once: the lines the terminal prints when a run ends, the first
screen of its report, and the table a user loads all come from one ``Answer`` per hook entry.

A hook type's answerer is a function ``(run_dir, entry) -> Answer | None`` named in ``ANSWERERS``
as ``"module:function"`` and imported only when a run of that type is summarized. A type without
one, or whose answerer finds nothing to answer with (``None``), is answered by the statistics the entry
recorded (``RECORDED``); ``None`` from that too means the entry recorded no statistic row.
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
    "attribution": "runner.analysis.answers.methods:methods_answer",
    "clamp": "runner.analysis.answers.statistics:clamp_answer",
    "dla": "runner.analysis.answers.dla:dla_answer",
    "generate": "runner.analysis.answers.generation:generation_answer",  # mode=generate's own (not a hook type)
    "logit_lens": "runner.analysis.answers.lens:lens_answer",
    "patch": "runner.analysis.answers.methods:patch_answer",
    "steer": "runner.analysis.answers.methods:methods_answer",
    "store": "runner.analysis.answers.store:store_answer",
    "units": "runner.analysis.answers.units:answer",
}
#: Hook type -> "module:function" answering for every job of a sweep at once, ``(path, entry, corrupted, on_corrupt)``
#: (``corrupted``: a patching sweep's baseline run, or ``None``); the sweep's table of jobs answers for
#: the other types.
SWEEP_ANSWERERS: dict[str, str] = {
    "attribution": "runner.analysis.answers.methods:methods_answer",
    "generate": "runner.analysis.answers.generation:generation_sweep_answer",
    "patch": "runner.analysis.answers.methods:methods_answer",
    "steer": "runner.analysis.answers.methods:methods_answer",
}


#: The answer of every other entry: what it recorded in ``stats.parquet``.
RECORDED = "runner.analysis.answers.statistics:recorded_answer"


def answer_of(run_dir: str | Path, entry: str, hook_type: str) -> Answer | None:
    """The answer of hook ``entry`` (of type ``hook_type``) of the complete run at ``run_dir``: its type's
    answerer's, else ``RECORDED``'s; ``None`` when neither finds anything to answer with."""
    target = ANSWERERS.get(hook_type)
    answer = _imported(target)(Path(run_dir), entry) if target else None
    return answer if answer is not None else _imported(RECORDED)(Path(run_dir), entry)


def sweep_answer_of(path: str | Path, types: dict[str, str], corrupted: str | Path | None = None,
                    on_corrupt: str = "error") -> Answer | None:
    """The answer of the sweep at ``path`` whose jobs' entries are ``types`` (``{entry: hook type}``), from
    ``SWEEP_ANSWERERS`` (one answerer called once however many entries name it); ``None`` when no entry's
    type has a sweep answerer or its runs hold nothing to answer with; ``on_corrupt`` as for ``load_stats``."""
    targets = {SWEEP_ANSWERERS[kind]: entry for entry, kind in types.items() if kind in SWEEP_ANSWERERS}
    answers = [_imported(target)(Path(path), entry, corrupted, on_corrupt) for target, entry in targets.items()]
    answers = [answer for answer in answers if answer is not None]
    if not answers:
        return None
    return Answer([line for answer in answers for line in answer.lines], answers[0].table)


def _imported(target: str):
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)
