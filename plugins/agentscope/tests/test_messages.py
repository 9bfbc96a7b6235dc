"""DashScope-formatted messages (the seeds' formatter) become OpenAI chat messages."""

from __future__ import annotations

from agenttune_agentscope.messages import openai_messages


def test_dashscope_parts_get_types_and_empty_content_becomes_none():
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"text": "look"}, {"image": "https://x/cat.png"}]},
        {"role": "assistant", "content": [], "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1", "name": "add"},
    ]

    assert openai_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1", "name": "add"},
    ]


def test_openai_shaped_messages_pass_unchanged_and_input_is_not_mutated():
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    before = [dict(message) for message in messages]

    assert openai_messages(messages) == before
    assert messages == before
