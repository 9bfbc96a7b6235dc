"""Errors that reach the user.

A `UserError` is a mistake the user can fix (a bad config value, a missing file, an unknown plugin).
The CLI prints its message as one short paragraph and exits with code 2, without a traceback
(`--debug` shows one). Everything else is a bug in agenttune or in a plugin and keeps its traceback.
"""

from __future__ import annotations


def sentence(text: str) -> str:
    """`text` stripped and ending in a full stop, unless it already ends in punctuation."""
    text = text.strip()
    return text if not text or text[-1] in ".?!:" else text + "."


class UserError(Exception):
    """A mistake in the user's input, explained in one paragraph that says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = sentence(message)
        self.hint = sentence(hint) if hint else None
        super().__init__(self.render())

    def render(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message


class PluginError(UserError):
    """Two plugins clash, or a requested plugin is missing or broken."""


class PluginWarning(UserWarning):
    """A plugin failed to load or one of its hooks raised; the rest of agenttune keeps working."""
