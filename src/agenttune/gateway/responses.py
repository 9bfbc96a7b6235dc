"""Writing a chat completion as OpenAI JSON, or as server-sent events ending in a usage chunk."""

from __future__ import annotations

import json
from typing import Any

from agenttune.gateway.completions import ChatResult

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps would build one per call


def dumps(value: Any) -> bytes:
    return _COMPACT.encode(value).encode()


def _usage(result: ChatResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def _logprobs(result: ChatResult) -> dict[str, Any] | None:
    if result.token_logprobs is None:
        return None
    return {"content": [{"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
                        for token, logprob in result.token_logprobs]}


def completion_body(result: ChatResult) -> bytes:
    return dumps({
        "id": result.id, "object": "chat.completion", "created": result.created, "model": result.request.model,
        "choices": [{"index": 0, "message": result.message, "logprobs": _logprobs(result),
                     "finish_reason": result.finish_reason}],
        "usage": _usage(result),
    })


def completion_events(result: ChatResult) -> bytes:
    """The whole reply as SSE: role, reasoning, content, tool calls, finish, usage, [DONE]."""
    head = {"id": result.id, "object": "chat.completion.chunk", "created": result.created,
            "model": result.request.model}
    if result.request.include_usage:
        head["usage"] = None
    message = result.message
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning_content"):
        deltas.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    events = [_event({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
              for delta in deltas]
    if result.token_logprobs is not None:  # attach logprobs to the content chunk's neighbour: a chunk of its own
        events.append(_event({**head, "choices": [{"index": 0, "delta": {}, "logprobs": _logprobs(result),
                                                   "finish_reason": None}]}))
    events.append(_event({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                               "finish_reason": result.finish_reason}]}))
    if result.request.include_usage:
        events.append(_event({**head, "choices": [], "usage": _usage(result)}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"
