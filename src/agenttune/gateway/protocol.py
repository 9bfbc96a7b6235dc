"""Reading a `/v1/chat/completions` request: validate what matters, normalise, ignore the rest.

Messages come out as plain dicts in one shape the chat template and the timeline can rely on:
`role` (system, user, assistant, tool), `content` (a string, never None or parts), and where given
`name`, `tool_calls` (`[{id, type, function: {name, arguments: JSON string}}]`), `tool_call_id`,
`reasoning_content`. Anything wrong is a `GatewayError` 400 that says which field and why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from agenttune.gateway.api_errors import bad_request

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
TEXT_PART_TYPES = {"text", "input_text", "output_text"}
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
# Sampling values a client may send, with OpenAI's ranges (vLLM's for its extensions). The episode
# decides how the policy samples, so the gateway does not apply them, but it refuses what no server
# would accept: a client learns of its mistake instead of having it silently ignored.
SAMPLING_RANGES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0, 2), "top_p": (float, 0, 1), "presence_penalty": (float, -2, 2),
    "frequency_penalty": (float, -2, 2), "min_p": (float, 0, 1), "repetition_penalty": (float, 0, 2),
    "top_logprobs": (int, 0, 20), "top_k": (int, -1, 2**31 - 1), "seed": (int, -(2**63), 2**64 - 1),
}
_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object",
               list: "a list", type(None): "null"}


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # The JSON schema the reply must follow (response_format json_object / json_schema); None: free text.
    response_schema: dict[str, Any] | None = None

    @property
    def tool_names(self) -> set[str]:
        return {tool["function"]["name"] for tool in self.tools}

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        shown = f"n={n!r}" if isinstance(n, int) else "this 'n'"
        raise bad_request(f"{shown} is not supported: the gateway returns one choice per request "
                          "(each choice would be a separate training sample). Send n=1 or leave it out.", param="n",
                          code="unsupported_value")
    check_sampling(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string.", param="model", code="invalid_type")
    stream = _optional(body, "stream", bool) or False
    stream_options = _optional(body, "stream_options", dict) or {}
    return ChatRequest(
        model=model or "agenttune",
        messages=_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=_optional(body, "parallel_tool_calls", bool, default=True),
        stream=stream,
        include_usage=bool(stream and stream_options.get("include_usage")),
        max_tokens=_max_tokens(body),
        stop=_stop(body.get("stop")),
        logprobs=bool(_optional(body, "logprobs", bool)),
        template_kwargs=_optional(body, "chat_template_kwargs", dict) or {},
        response_schema=_response_schema(body.get("response_format")),
    )


def _optional(body: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"'{key}' must be {_KIND_NAMES[kind]}, not {_KIND_NAMES.get(type(value), 'that')}.",
                          param=key, code="invalid_type")
    return value


def check_sampling(body: dict[str, Any]) -> None:
    """400 for a sampling value out of its range, with OpenAI's codes (`decimal_above_max_value`, ...)."""
    for key in body.keys() & SAMPLING_RANGES.keys():
        kind, low, high = SAMPLING_RANGES[key]
        value = body[key]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
            raise bad_request(f"Invalid type for '{key}': expected {_KIND_NAMES[kind]}, but got "
                              f"{_KIND_NAMES.get(type(value), 'something else')} instead.", param=key,
                              code="invalid_type")
        if not math.isfinite(value):
            raise bad_request(f"Invalid '{key}': {value} is not a number.", param=key, code="invalid_value")
        word = "integer" if kind is int else "decimal"
        if value < low:
            raise bad_request(f"Invalid '{key}': {word} below minimum value. Expected a value >= {low:g}, but got "
                              f"{value} instead.", param=key, code=f"{word}_below_min_value")
        if value > high:
            raise bad_request(f"Invalid '{key}': {word} above maximum value. Expected a value <= {high:g}, but got "
                              f"{value} instead.", param=key, code=f"{word}_above_max_value")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = _optional(body, key, int)
        if value is not None:
            if value < 1:
                raise bad_request(f"'{key}' must be at least 1, got {value}.", param=key)
            return value
    return None


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return tuple(item for item in stop if item)
    raise bad_request("'stop' must be a string or a list of strings.", param="stop")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of message objects.", param="messages",
                          code="missing_required_parameter" if messages is None else "invalid_value")
    return [_message(message, index) for index, message in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, Any]:
    # Every request re-sends the whole conversation: the common case is kept to a few lookups, and
    # the field paths for error messages are only spelled out when there is an error.
    if not isinstance(message, dict):
        raise bad_request(f"messages[{index}] must be an object with 'role' and 'content'.", param=f"messages[{index}]")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"messages[{index}].role must be one of system, user, assistant, tool; got {role!r}.",
                          param=f"messages[{index}].role")
    role = _ROLE_ALIASES.get(role, role)
    content = message.get("content")
    if type(content) is not str:
        content = _content(content, f"messages[{index}].content")
    normal: dict[str, Any] = {"role": role, "content": content}
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"messages[{index}].name must be a string.", param=f"messages[{index}].name")
        normal["name"] = name
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls:
            normal["tool_calls"] = _tool_calls(calls, f"messages[{index}].tool_calls")
        reasoning = message.get("reasoning_content") if "reasoning_content" in message else message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            normal["reasoning_content"] = reasoning
    elif role == "tool" and isinstance(message.get("tool_call_id"), str):
        normal["tool_call_id"] = message["tool_call_id"]
    return normal


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in TEXT_PART_TYPES or kind is None:
                raise bad_request(f"{where}[{index}] must be a text part: {{\"type\": \"text\", \"text\": \"...\"}}.",
                                  param=where)
            else:
                raise bad_request(f"{where}[{index}] is a {kind!r} part; this model only takes text parts.",
                                  param=where)
        return "".join(texts)
    raise bad_request(f"{where} must be a string or a list of text parts, not {type(content).__name__}.", param=where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list.", param=where)
    normal = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise bad_request(f"{where}[{index}] must look like {{\"id\": ..., \"type\": \"function\", "
                              "\"function\": {\"name\": ..., \"arguments\": \"{...}\"}}.", param=where)
        arguments = function.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            try:
                arguments = json.dumps(arguments, ensure_ascii=False)
            except (TypeError, ValueError):
                raise bad_request(f"{where}[{index}].function.arguments must be JSON.", param=where) from None
        call_id = call.get("id")
        normal.append({"id": call_id if isinstance(call_id, str) else f"call_{index}", "type": "function",
                       "function": {"name": name, "arguments": arguments}})
    return normal


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects.",
                          param="tools")
    normal = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                              "\"parameters\": {...}}}}.", param=f"tools[{index}]")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request(f"tools[{index}].function.parameters must be a JSON-schema object.",
                              param=f"tools[{index}]")
        normal.append({"type": "function", "function": function})
    return normal


def _response_schema(response_format: Any) -> dict[str, Any] | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None and isinstance(spec, dict):
            return {}  # no schema given: any JSON value, as OpenAI
        if isinstance(schema, dict | bool):
            return schema if isinstance(schema, dict) else {}
        raise bad_request("response_format.json_schema.schema must be a JSON-schema object.",
                          param="response_format")
    raise bad_request("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}.",
                      param="response_format")


def _tool_choice(choice: Any) -> str | dict[str, Any]:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and isinstance(
            choice["function"].get("name"), str):
        return choice
    raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}.", param="tool_choice")
