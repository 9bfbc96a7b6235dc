"""Turn the message dicts AgentScope 1.x formatters produce into plain OpenAI chat messages.

The seeds' agents use `DashScopeChatFormatter`, whose content parts carry no `type`
(`{"text": ...}`, `{"image": url}`) and whose tool-call-only assistant turns have `content: []`.
The gateway speaks the OpenAI protocol, so the parts get their types and empty content becomes None,
exactly as AgentScope's own `OpenAIChatFormatter` would have written them.
"""

from __future__ import annotations

from typing import Any

_MEDIA_PARTS = {
    "image": lambda url: {"type": "image_url", "image_url": {"url": url}},
    "audio": lambda url: {"type": "input_audio", "input_audio": {"data": url, "format": "wav"}},
    "video": lambda url: {"type": "video_url", "video_url": {"url": url}},
}


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` in OpenAI's shape; messages already in that shape come back equal."""
    return [_openai_message(message) for message in messages]


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    parts = [_openai_part(part) for part in content]
    return {**message, "content": parts or None}


def _openai_part(part: Any) -> Any:
    if not isinstance(part, dict) or "type" in part:
        return part
    if "text" in part:
        return {"type": "text", "text": part["text"]}
    for key, build in _MEDIA_PARTS.items():
        if key in part:
            return build(part[key])
    return part
