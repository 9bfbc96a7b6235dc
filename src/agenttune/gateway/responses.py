"""Writing a chat completion (`ChatResult`) as OpenAI JSON, or as server-sent events ending in a usage chunk.

`ChatResult` is defined here, beside what writes it: completions.py makes results and imports the
writers, so the writers cannot import completions.py (an import cycle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune.gateway.api_errors import GatewayError
    from agenttune.gateway.protocol import ChatRequest

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps would build one per call


def dumps(value: Any) -> bytes:
    return _COMPACT.encode(value).encode()


@dataclass
class ChatResult:
    """A finished call, ready to be written as a JSON body or as SSE chunks."""

    request: ChatRequest
    id: str
    created: int
    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_logprobs: list[tuple[str, float]] | None = None


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
    """A finished reply as SSE in one go (engines that answer whole): role, reasoning, content, tool
    calls, finish, usage, [DONE]."""
    chunks = ChunkWriter(result.request, result.id, result.created)
    message = result.message
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning_content"):
        deltas.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    return b"".join([*(chunks.delta(delta) for delta in deltas), chunks.ending(result)])


class ChunkWriter:
    """`chat.completion.chunk` events of one reply (all share its id, creation time and model)."""

    def __init__(self, request: ChatRequest, id: str, created: int):
        self.request, self.id, self.created = request, id, created
        self.head: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created,
                                     "model": request.model}
        if request.include_usage:
            self.head["usage"] = None

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _event({**self.head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})

    def ending(self, result: ChatResult) -> bytes:
        """Logprobs (a chunk of their own), the finish reason, usage when asked for, [DONE]."""
        events = []
        if result.token_logprobs is not None:
            events.append(_event({**self.head, "choices": [{"index": 0, "delta": {}, "logprobs": _logprobs(result),
                                                            "finish_reason": None}]}))
        events.append(_event({**self.head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                        "finish_reason": result.finish_reason}]}))
        if self.request.include_usage:
            events.append(_event({**self.head, "choices": [], "usage": _usage(result)}))
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    def error(self, error: GatewayError) -> bytes:
        """A failure after the stream started (its status line is sent): an error event, then [DONE]."""
        return _event(error.body()) + b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"
