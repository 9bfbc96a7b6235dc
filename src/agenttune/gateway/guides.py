"""What a request obliges the reply to be (tool_choice, response_format), as a grammar for the engine.

| request | guide |
| --- | --- |
| `tool_choice: "none"` or `"auto"` (parallel calls allowed), no `response_format` | none: the model writes freely |
| `tool_choice: "auto"` with `parallel_tool_calls: false` | free text, and at most one tool call, whose arguments follow its schema |
| `tool_choice: "required"` | one or more tool calls (one with `parallel_tool_calls: false`), nothing else |
| `tool_choice: {"type": "function", "function": {"name": N}}` | exactly one call of N |
| `response_format: json_object / json_schema` | a JSON value following the schema; with tools and `auto`, either that or tool calls |

Tool calls are spelled the way the tool parser reads them (Hermes: `<tool_call>\\n{"name": N, "arguments":
ARGS}\\n</tool_call>`, ARGS following the tool's `parameters` schema). The guide is an xgrammar/vLLM
structural tag, so the `hf` engine (xgrammar) and vLLM (its structured outputs) enforce the same thing.
"""

from __future__ import annotations

import json
from typing import Any

from agenttune.components.engines.base import Guide
from agenttune.components.parsers.base import ToolParser
from agenttune.components.parsers.hermes import HermesToolParser
from agenttune.gateway.api_errors import bad_request
from agenttune.gateway.protocol import ChatRequest

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def guide_for(request: ChatRequest, tool_parser: ToolParser) -> Guide | None:
    """The grammar `request` obliges the reply to follow; None when the reply is free."""
    choice = request.tool_choice
    forced = choice == "required" or isinstance(choice, dict)
    if forced and not request.tools:
        raise bad_request(f"tool_choice {_shown(choice)} needs 'tools': there is no tool to call.",
                          param="tool_choice")
    if forced and request.response_schema is not None:
        raise bad_request("tool_choice 'required' or a named function leaves no room for a response_format reply; "
                          "send one or the other.", param="response_format")
    constrains_tools = request.parses_tool_calls and (forced or not request.parallel_tool_calls)
    if not constrains_tools:
        if request.response_schema is None:
            return None
        return _structural_tag(_json(request.response_schema))
    if not isinstance(tool_parser, HermesToolParser):
        return None  # the gateway knows how to spell calls for its own parsers only: not enforced
    tools = request.tools
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tools = [tool for tool in tools if tool["function"]["name"] == name]
        if not tools:
            raise bad_request(f"tool_choice names the function {name!r}, which is not among 'tools' "
                              f"({', '.join(sorted(request.tool_names))}).", param="tool_choice")
    tags = [_call_tag(tool) for tool in tools]
    one = isinstance(choice, dict) or not request.parallel_tool_calls
    if forced:
        calls = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
                 "stop_after_first": one}
    else:
        calls = {"type": "triggered_tags", "triggers": [HermesToolParser.START], "tags": tags,
                 "at_least_one": False, "stop_after_first": one}
    if request.response_schema is not None:  # auto: tool calls, or the formatted answer
        calls = {"type": "or", "elements": [
            {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
             "stop_after_first": one},
            _json(request.response_schema)]}
    return _structural_tag(calls)


def _structural_tag(format: dict[str, Any]) -> Guide:
    return Guide("structural_tag", json.dumps({"type": "structural_tag", "format": format}))


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    parameters = function.get("parameters") or _ANY_OBJECT
    return {"type": "tag", "begin": f'{HermesToolParser.START}\n{{"name": {json.dumps(function["name"])}, "arguments": ',
            "content": _json(parameters),
            "end": f"}}\n{HermesToolParser.END}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    # At most one whitespace character between JSON tokens: without a bound, a model unsure of the next
    # key pads with newlines until it runs out of tokens.
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


def _shown(choice: Any) -> str:
    return repr(choice) if isinstance(choice, str) else f"{{function: {choice['function']['name']!r}}}"
