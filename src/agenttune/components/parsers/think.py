"""The built-in reasoning parser: `<think>...</think>` goes to `reasoning_content`.

`gateway.reasoning_parser: think` (default) or null (no parsing: the text stays in content).
"""

from __future__ import annotations

from agenttune.components.parsers.base import ReasoningParser


class ThinkParser(ReasoningParser):
    """`<think>reasoning</think>answer`. Also handles templates that open `<think>` in the prompt
    (the reply then starts inside the reasoning and only closes it)."""

    name = "think"
    OPEN, CLOSE = "<think>", "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        close = text.find(self.CLOSE)
        if close < 0:
            return None, text
        before, after = text[:close], text[close + len(self.CLOSE):]
        open_at = before.find(self.OPEN)
        if open_at >= 0:
            if before[:open_at].strip():  # text before <think>: not a reasoning block
                return None, text
            before = before[open_at + len(self.OPEN):]
        return before.strip("\n"), after.lstrip("\n")

