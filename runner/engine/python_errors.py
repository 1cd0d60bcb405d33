"""``runner.attach``'s mistakes in a Python caller's terms, and in one line.

The store's errors name the command line's remedies (``overwrite=true``, ``hydra.run.dir``); a
script calling ``runner.attach`` fixes them with keywords (``overwrite=True``, ``out_dir=``), so
``python_remedies`` says those instead. A ``ConfigError`` that no one catches is a mistake in
the call, not a bug: ``one_line_errors`` prints it as ``error: ...`` in one line, as the command
line does, instead of a traceback through the runner's frames (every other exception, and every
``ConfigError`` in an interactive shell, which keeps its own hook, is shown as Python shows it).
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator

from common.errors import ConfigError
from runner.store.claim import CompleteRunError


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

    return wrapper
