"""The contracts of the gateway's parsers: tool calls and reasoning, read out of a reply's text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agenttune.config.base import Component
from agenttune.web.ids import random_id


@dataclass
class ToolParse:
    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls entries
    errors: list[str] = field(default_factory=list)  # why a call could not be read


class ToolParser(Component):
    """Turns reply text into content + tool calls, and reports what it could not read (a madness
    signal: `wrong_toolcall`).

    A tool parser class has a unique `name` (what `gateway.tool_parser` selects) and is created once
    per gateway, with no arguments. `START` and `END`, when the format marks calls with them, let the
    gateway hold back a call's text while streaming and keep the finished calls of a reply the token
    budget cut off; a format without markers leaves them None.
    """

    START: ClassVar[str | None] = None
    END: ClassVar[str | None] = None

    def parse(self, text: str) -> ToolParse:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement parse(text)")


class ReasoningParser(Component):
    """Separates a reply's reasoning from its answer; the reasoning goes to `reasoning_content`.

    A reasoning parser class has a unique `name` (what `gateway.reasoning_parser` selects) and is
    created once per gateway, with no arguments. `OPEN` and `CLOSE` (required, non-empty) are the
    markers around the reasoning: streaming sends the text between them as reasoning deltas, and a prompt that ends
    in `OPEN` (a template that opens the block itself) starts the reply inside the reasoning.
    """

    OPEN: ClassVar[str] = ""
    CLOSE: ClassVar[str] = ""

    def split(self, text: str) -> tuple[str | None, str]:  # pragma: no cover - abstract
        """(reasoning, answer); reasoning is None when the text holds none."""
        raise NotImplementedError(f"{type(self).__name__} must implement split(text)")


def new_call_id() -> str:
    return random_id("call_")


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI `tool_calls` entry, with a fresh id."""
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
