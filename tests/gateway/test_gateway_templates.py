"""Exact timelines with real model families' chat templates (Qwen2.5, Qwen3 thinking and not).

The templates (tests/data/) are the official ones; they run on the tiny tokenizer, which has the same
special tokens. The reference is transformers' `apply_chat_template` on the same conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing.gateways import running_gateway

DATA = Path(__file__).resolve().parents[1] / "data"
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Arithmetic",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]


def tokenizer_with(template: str, tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = (DATA / template).read_text()
    return tokenizer


async def tool_loop(tokenizer, replies, **request):
    """user -> call -> result -> call -> result -> answer, echoing replies as the openai client does."""
    engine = ScriptedEngine(replies, tokenizer=tokenizer)
    async with running_gateway(engine, tokenizer=tokenizer, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                    http_client=httpx.AsyncClient(transport=channel.async_transport()))
        messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+2?"}]
        history = []
        for _ in replies:
            response = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **request)
            message = response.choices[0].message.model_dump(exclude_none=True)
            history.append(list(messages))
            messages = messages + [message]
            if message.get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "4"})
    return engine, channel, history, messages


def render(tokenizer, messages, generation_prompt, **kwargs):
    """The reference rendering; tool-call arguments as objects, as vLLM hands them to templates."""
    messages = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                         add_generation_prompt=generation_prompt, **kwargs)


CALL = '<tool_call>\n{"name": "calc", "arguments": {"x": 2}}\n</tool_call>'


@pytest.mark.parametrize("template", ["qwen2_5_chat_template.jinja", "qwen3_chat_template.jinja"])
def test_merged_context_is_the_template_rendering_of_the_conversation(template, tiny_model_path):
    """Tool loops under the official templates (Qwen3 thinking: reasoning kept) are append-only."""
    import asyncio

    tokenizer = tokenizer_with(template, tiny_model_path)
    think = "<think>\nadd them\n</think>\n\n" if "qwen3" in template else ""
    replies = [think + CALL, think + CALL, think + "It is 4."]
    engine, channel, history, messages = asyncio.run(tool_loop(tokenizer, replies))
    [sample] = channel.samples()
    assert sample.num_calls == 3 and channel.metrics()["merge_breaks"] == 0
    context = sample.prompt_ids + sample.response_ids
    for prompt, messages_then in zip(engine.prompts, history, strict=True):
        assert context[: len(prompt)] == prompt
        assert tokenizer.decode(prompt) == render(tokenizer, messages_then, True)
    assert tokenizer.decode(context) + "\n" == render(tokenizer, messages, False)


def test_qwen3_without_thinking_starts_a_sample_per_call_prompted_as_the_template_renders(tiny_model_path):
    """With enable_thinking=false the prompt ends in an empty <think> block, which Qwen3's template
    drops when it re-renders earlier turns. Merging would prompt the engine with ids the template never
    writes, so every call starts its own sample (issue 24), each prompted exactly as rendered."""
    import asyncio

    tokenizer = tokenizer_with("qwen3_chat_template.jinja", tiny_model_path)
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    engine, channel, history, messages = asyncio.run(tool_loop(tokenizer, [CALL, CALL, "It is 4."], extra_body=kwargs))
    samples = channel.samples()
    metrics = channel.metrics()
    assert len(samples) == 3 and metrics["merge_break/template_rewrote_history"] == 2
    for sample, prompt, messages_then in zip(samples, engine.prompts, history, strict=True):
        assert sample.prompt_ids == prompt
        assert tokenizer.decode(prompt) == render(tokenizer, messages_then, True, enable_thinking=False)
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
