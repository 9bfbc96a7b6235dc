"""Issue 24: the engine is prompted with what the chat template renders, also when templates look ahead.

A call extends the previous sample only when the template, given the new messages, writes the
history up to the end of the previous reply exactly as it did when that reply was the last message.
Qwen3 drops earlier turns' reasoning once a user speaks again (also the empty think block of
`enable_thinking=false`, and a think block left in the content without a reasoning parser);
Mistral v0.3 moves the tool list before the last user turn. Each must start a new sample, counted
under its reason, whose prompt is exactly the template's rendering.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing.gateways import running_gateway, tiny_config

DATA = Path(__file__).resolve().parents[1] / "data"
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Arithmetic",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]
THOUGHT = "<think>\nplan\n</think>\n\nHello."


def tokenizer_with(template: str, tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = (DATA / template).read_text()
    return tokenizer


async def two_user_turns(tokenizer, replies, *, tools=None, reasoning_parser="think", **request):
    """A plain OpenAI client: "Hi", the reply sent back as the client got it, then "Again"."""
    engine = ScriptedEngine(replies, tokenizer=tokenizer)
    config = tiny_config(gateway={"reasoning_parser": reasoning_parser})
    async with running_gateway(engine, tokenizer=tokenizer, config=config, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                    http_client=httpx.AsyncClient(transport=channel.async_transport()))
        extra = {"tools": tools} if tools else {}
        messages = [{"role": "user", "content": "Hi"}]
        sent = []
        for follow_up in ("Again", None):
            sent.append(list(messages))
            response = await client.chat.completions.create(model="m", messages=messages, **extra, **request)
            reply = response.choices[0].message.model_dump(exclude_none=True)
            messages = [*messages, reply]
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
    return engine, channel, sent


def rendered_ids(tokenizer, messages, tools=None, **kwargs):
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


CASES = {
    "qwen3 thinking": ("qwen3_chat_template.jinja", [THOUGHT, "Fine."], {}, "think", "template_rewrote_history"),
    "qwen3 enable_thinking=false": ("qwen3_chat_template.jinja", ["Hello.", "Fine."],
                                    {"enable_thinking": False}, "think", "template_rewrote_history"),
    "qwen3 without a reasoning parser": ("qwen3_chat_template.jinja", [THOUGHT, "Fine."], {}, None,
                                         "template_rewrote_reply"),
    "mistral v0.3 tools before the last user turn": ("mistral_v0_3_style_chat_template.jinja",
                                                     ["Hello.", "Fine."], {}, "think", "template_rewrote_history"),
}


@pytest.mark.parametrize("case", CASES)
def test_look_ahead_templates_start_a_new_sample_prompted_as_the_template_renders(case, tiny_model_path):
    template, replies, template_kwargs, parser, reason = CASES[case]
    tokenizer = tokenizer_with(template, tiny_model_path)
    tools = TOOLS if "mistral" in template else None
    extra = {"extra_body": {"chat_template_kwargs": template_kwargs}} if template_kwargs else {}
    engine, channel, sent = asyncio.run(two_user_turns(tokenizer, replies, tools=tools, reasoning_parser=parser,
                                                      **extra))
    metrics = channel.metrics()
    assert metrics["merge_breaks"] == 1 and metrics[f"merge_break/{reason}"] == 1
    assert len(channel.samples()) == 2
    for prompt, messages in zip(engine.prompts, sent, strict=True):
        assert prompt == rendered_ids(tokenizer, messages, tools, **template_kwargs)
    second = channel.samples()[1]
    assert second.prompt_ids == engine.prompts[1]


def test_the_issue_numbers_the_old_merge_produced_are_gone(tiny_model_path):
    """The issue's example: the merged second prompt was 41 ids where the template renders 32."""
    tokenizer = tokenizer_with("qwen3_chat_template.jinja", tiny_model_path)
    engine, channel, sent = asyncio.run(two_user_turns(tokenizer, [THOUGHT, "Fine."]))
    expected = rendered_ids(tokenizer, sent[1])
    assert engine.prompts[1] == expected
    assert "plan" not in tokenizer.decode(engine.prompts[1])  # the template dropped the earlier reasoning


def test_a_tool_loop_under_qwen3_thinking_still_merges(tiny_model_path):
    """Reasoning after the last user turn is kept by the template: calls there extend the sample."""
    tokenizer = tokenizer_with("qwen3_chat_template.jinja", tiny_model_path)
    call = '<think>\nadd\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"x": 2}}\n</tool_call>'

    async def tool_loop():
        engine = ScriptedEngine([call, "<think>\ndone\n</think>\n\nIt is 4."], tokenizer=tokenizer)
        async with running_gateway(engine, tokenizer=tokenizer, http=False) as gateway:
            channel = gateway.open_episode("e1")
            client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                        http_client=httpx.AsyncClient(transport=channel.async_transport()))
            messages = [{"role": "user", "content": "2+2?"}]
            first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            reply = first.choices[0].message.model_dump(exclude_none=True)
            messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "4"}]
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            return engine, channel, messages

    engine, channel, messages = asyncio.run(tool_loop())
    [sample] = channel.samples()
    assert sample.num_calls == 2 and channel.metrics()["merge_breaks"] == 0
    assert engine.prompts[1] == rendered_ids(tokenizer, messages, TOOLS)
