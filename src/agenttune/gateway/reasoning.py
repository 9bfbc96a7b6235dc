"""Separating reasoning from the answer: `<think>...</think>` goes to `reasoning_content`.

`gateway.reasoning_parser: think` (default) or null (no parsing: the text stays in content).
"""

from __future__ import annotations

from agenttune.errors import UserError


class ThinkParser:
    """`<think>reasoning</think>answer`. Also handles templates that open `<think>` in the prompt
    (the reply then starts inside the reasoning and only closes it)."""

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


REASONING_PARSERS = {"think": ThinkParser}


def get_reasoning_parser(name: str | None) -> ThinkParser | None:
    if name is None:
        return None
    if name not in REASONING_PARSERS:
        raise UserError(f"gateway.reasoning_parser: unknown reasoning parser {name!r}. "
                        f"Available: {', '.join(sorted(REASONING_PARSERS))}.",
                        hint="Use 'think', or null to leave reasoning in the content.")
    return REASONING_PARSERS[name]()
