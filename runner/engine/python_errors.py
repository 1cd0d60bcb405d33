"""``runner.attach``'s mistakes in a Python caller's terms, and in one line.

The store's and the memory budget's errors name the command line's remedies (``overwrite=true``,
``hydra.run.dir``, ``sample.batch=N``); a script calling ``runner.attach`` fixes them with keywords
(``overwrite=True``, ``out_dir=``, ``sample={"batch": N}``), so ``python_remedies`` says those
instead. A ``ConfigError`` that no one catches is a mistake in the call, not a bug:
``one_line_errors`` prints it as ``error: ...`` in one line, as the command line does, instead of
a traceback through the runner's frames (every other exception, and every ``ConfigError`` in an
interactive shell, which keeps its own hook, is shown as Python shows it).
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator

from common.errors import ConfigError
from runner.engine.budget import OverBudget
from runner.store.claim import CompleteRunError

#: ``budget.COMMAND_LINE``'s remedies as ``runner.attach``'s keywords.
BUDGET_KEYWORDS = {"batch": "sample={'batch': N}", "budget": "memory={'budget': SIZE}"}


def one_line_errors() -> None:
    """Print an uncaught ``ConfigError`` as one ``error: ...`` line (exit status 1, as any uncaught error)."""
    previous = sys.excepthook
    if getattr(previous, "one_line_config_errors", False):
        return

    def hook(kind, exc, traceback) -> None:
        if issubclass(kind, ConfigError):
            print(f"error: {exc}", file=sys.stderr)
        else:
            previous(kind, exc, traceback)

    hook.one_line_config_errors = True
    sys.excepthook = hook


def python_remedies(generator: Callable[..., Iterator]) -> Callable[..., Iterator]:
    """Wrap the generator of a ``contextlib.contextmanager`` so that its command-line remedies
    become keyword ones and its uncaught mistakes print in one line."""

    @functools.wraps(generator)
    def wrapper(*args, **kwargs):
        one_line_errors()
        try:
            return (yield from generator(*args, **kwargs))
        except CompleteRunError as exc:
            raise ConfigError(f"out_dir: '{exc.out_dir}' already holds a complete run; pass overwrite=True to "
                              f"replace it, or another out_dir") from None
        except OverBudget as exc:
            raise ConfigError(exc.line(BUDGET_KEYWORDS)) from None

    return wrapper
