"""The built-in tool-call parser: Hermes-style `<tool_call>` blocks (`gateway.tool_parser: hermes`)."""

from __future__ import annotations

import json
import re
from typing import Any

from agenttune.components.parsers.base import ToolParse, ToolParser, tool_call

_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False) would build one per call


class HermesToolParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen, Hermes, many others).

    Content is the text before the first call. If any call cannot be read, the whole text is
    returned as content with no calls (as vLLM does), and the errors say why.
    """

    name = "hermes"
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
