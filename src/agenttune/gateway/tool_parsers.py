"""Reading tool calls out of model text. Pluggable: `gateway.tool_parser` names one.

A parser turns the reply text into content + tool calls, and reports what it could not read (a
madness signal: `wrong_toolcall`). Register more with `@register_tool_parser("name")`, or point
`gateway.tool_parser` at `module:Class`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agenttune.errors import UserError
from agenttune.gateway.ids import random_id


@dataclass
class ToolParse:
    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls entries
    errors: list[str] = field(default_factory=list)  # why a call could not be read


class ToolParser:
    name: ClassVar[str] = ""

    def parse(self, text: str) -> ToolParse:  # pragma: no cover - abstract
        raise NotImplementedError


TOOL_PARSERS: dict[str, type[ToolParser]] = {}
_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False) would build one per call


def register_tool_parser(name: str):
    def register(cls: type[ToolParser]) -> type[ToolParser]:
        cls.name = name
        TOOL_PARSERS[name] = cls
        return cls

    return register


def get_tool_parser(name: str) -> ToolParser:
    if name in TOOL_PARSERS:
        return TOOL_PARSERS[name]()
    if ":" in name or "->" in name:
        from agenttune.references import load_reference

        return load_reference(name, key="gateway.tool_parser")()
    raise UserError(f"gateway.tool_parser: unknown tool parser {name!r}. Available: {', '.join(sorted(TOOL_PARSERS))}.",
                    hint="Use one of those, or 'my_module:MyParser' (a subclass of agenttune.gateway.tool_parsers.ToolParser).")


def new_call_id() -> str:
    return random_id("call_")


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen, Hermes, many others).

    Content is the text before the first call. If any call cannot be read, the whole text is
    returned as content with no calls (as vLLM does), and the errors say why.
    """

    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ToolParse:
        start = text.find(self.START)
        if start < 0:
            return ToolParse(text)
        calls, errors = [], []
        for match in self._CALL.finditer(text, start):
            call, error = self._read(match.group(1))
            if call is None:
                errors.append(error or "unreadable tool call")
            else:
                calls.append(call)
        if errors:
            return ToolParse(text, [], errors)
        return ToolParse(text[:start].rstrip(), calls)

    def _read(self, body: str) -> tuple[dict[str, Any] | None, str | None]:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as error:  # what json.loads raises for any malformed text
            return None, f"tool call is not valid JSON ({error.msg}): {body.strip()[:120]!r}"
        except RecursionError:
            return None, "tool call nests JSON too deeply"
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
            return None, f"tool call has no 'name': {body.strip()[:120]!r}"
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return None, f"tool call arguments are not JSON: {arguments[:120]!r}"
        if not isinstance(arguments, dict):
            return None, f"tool call arguments must be an object, got {type(arguments).__name__}"
        encoded = _ENCODER.encode(arguments)
        if not _is_text(payload["name"] + encoded):  # "\ud800" in JSON decodes to a lone surrogate: not text
            return None, "tool call holds an unpaired \\ud800-\\udfff escape, which is not valid Unicode"
        return tool_call(payload["name"], encoded), None


def _is_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
