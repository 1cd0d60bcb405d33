"""User-facing configuration errors: one line, the bad key, the valid choices, the closest one."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A mistake in the user's config; the CLI prints it as one line, with no traceback."""


def closest(bad: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` choices that look like ``bad`` (difflib ratio), best first."""
    return difflib.get_close_matches(str(bad), [str(c) for c in choices], n=n, cutoff=0.5)


def choice_error(key: str, bad: object, choices: Iterable[str], what: str = "value") -> ConfigError:
    """Build the standard 'unknown X' error naming ``key``, listing ``choices`` and a suggestion.

    Example:
        >>> str(choice_error("hooks.clip.type", "clmap", ["clamp", "scale"], "hook type"))
        "hooks.clip.type: unknown hook type 'clmap'; valid: clamp, scale; did you mean 'clamp'?"
    """
    choices = sorted(choices)
    hint = closest(str(bad), choices, n=1)
    suffix = f"; did you mean '{hint[0]}'?" if hint else ""
    shown = ", ".join(choices[:30]) + (f", ... ({len(choices)} in all)" if len(choices) > 30 else "")
    return ConfigError(f"{key}: unknown {what} '{bad}'; valid: {shown}{suffix}")


class OutputError(OSError):
    """The run directory cannot be written (read-only, disk full, busy); nothing was left half-written."""

    def __str__(self) -> str:
        return str(self.strerror)
