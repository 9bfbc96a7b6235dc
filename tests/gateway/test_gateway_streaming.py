"""Real streaming (issue 23 item 1): chunks leave as tokens are sampled; what a stream adds up to, and
what it records, is what the same call without streaming returns and records."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.registry.resolution import build_engine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
USER = [{"role": "user", "content": "Hi"}]
REPLIES = {
    "reasoning, content and two calls": '<think>\nplan it\n</think>\n\nOn it.\n<tool_call>\n{"name": "calc", "arguments": '
                                         '{"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"y": '
                                         '"a longer argument that takes several fragments"}}\n</tool_call>',
    "plain text": "The answer is 42, as everyone knows.",
    "a stop string": "First part. END and what follows",
    "a broken call stays text": 'Let me see <tool_call>\n{"name": "calc", "arguments": {"x": </tool_call>',
    "a tag that is no call": "Brush each <tooth> twice.   And smile.",
    "unicode": "Ça coûte 5 € — ok 👍",
}


def client_for(channel) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                              http_client=httpx.AsyncClient(transport=channel.async_transport()))


def assemble(chunks) -> dict:
    """What an OpenAI client makes of a stream (as the SDK's stream helpers do)."""
    message = {"content": "", "reasoning_content": "", "calls": {}}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        message["content"] += delta.content or ""
        message["reasoning_content"] += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            entry = message["calls"].setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    return message


@pytest.mark.parametrize("reply", list(REPLIES.values()), ids=list(REPLIES))
async def test_a_stream_adds_up_to_the_plain_reply_and_records_the_same_sample(reply):
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([reply], tokenizer=tokenizer, cycle=True)  # streams token by token
    async with running_gateway(engine) as gateway:
        plain_channel, streamed_channel = gateway.open_episode("plain"), gateway.open_episode("streamed")
        body = {"model": "m", "messages": USER, "tools": TOOLS, "stop": ["END"]}
        plain = (await client_for(plain_channel).chat.completions.create(**body)).choices[0]
        stream = await client_for(streamed_channel).chat.completions.create(**body, stream=True)
        chunks = [chunk async for chunk in stream]
    streamed = assemble(chunks)
    assert streamed["content"] == (plain.message.content or "")
    assert streamed["reasoning_content"] == (getattr(plain.message, "reasoning_content", None) or "")
    assert [(call["name"], json.loads(call["arguments"])) for call in streamed["calls"].values()] == [
        (call.function.name, json.loads(call.function.arguments)) for call in plain.message.tool_calls or []]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.finish_reason]
    for chunk in chunks:  # markup never leaks into a delta that the plain reply does not show
        text = (chunk.choices[0].delta.content or "") if chunk.choices else ""
        for marker in ("<tool_call>", "</think>", "END"):
            assert marker not in text or marker in (plain.message.content or "")
    assert streamed_channel.samples() == plain_channel.samples()
    assert streamed_channel.metrics().get("stream_mismatch", 0) == 0
    if reply == REPLIES["plain text"]:
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 5  # token by token


@pytest.fixture
async def hf_gateway(tiny_model):
    config = tiny_config(rollout={"max_response_length_in_one_turn": 40})
    engine = build_engine(config, tiny_tokenizer(), model=tiny_model)
    async with running_gateway(engine, config=config) as gateway:
        yield gateway, engine
    await engine.aclose()


async def test_the_hf_engine_streams_each_decode_step_and_records_what_a_plain_call_does(hf_gateway):
    gateway, engine = hf_gateway
    greedy = SamplingParams(temperature=0, max_tokens=40)
    plain_channel, streamed_channel = gateway.open_episode("p", greedy), gateway.open_episode("s", greedy)
    plain = await client_for(plain_channel).chat.completions.create(model="m", messages=USER)
    steps_before = len(engine.decode_steps)
    stream = await client_for(streamed_channel).chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True})
    steps_at_chunk = []
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            steps_at_chunk.append(len(engine.decode_steps) - steps_before)
    total_steps = len(engine.decode_steps) - steps_before
    assert assemble(chunks)["content"] == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert streamed_channel.samples() == plain_channel.samples()  # same ids, mask and logprobs
    # Chunks left while the engine was still decoding, one per step once the text is known to be
    # content (this model's greedy reply starts with newlines, which might still precede a <think>).
    assert steps_at_chunk[0] < total_steps / 2 and len(steps_at_chunk) > total_steps / 2


async def test_a_client_that_stops_reading_abandons_the_generation(hf_gateway):
    gateway, engine = hf_gateway
    channel = gateway.open_episode("left", SamplingParams(temperature=1.0, max_tokens=40))
    stream = await client_for(channel).chat.completions.create(model="m", messages=USER, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()
    steps = len(engine.decode_steps)
    await asyncio.sleep(0.3)
    assert len(engine.decode_steps) <= steps + 2  # the row left the batch
    assert channel.metrics()["calls"] == 0 and channel.timeline("default").in_flight == 0  # nothing recorded


async def test_refusals_before_a_stream_keep_their_status_and_failures_during_it_end_it_with_an_error():
    tokenizer = tiny_tokenizer()

    def fail(prompt_ids, sampling):
        raise RuntimeError("the GPU fell over")

    async with running_gateway(ScriptedEngine(responder=fail, tokenizer=tokenizer),
                               config=tiny_config(model={"max_model_len": 256},
                                                 rollout={"max_response_length_in_one_turn": 64})) as gateway:
        channel = gateway.open_episode("e")
        client = client_for(channel)
        with pytest.raises(openai.APIError, match="the GPU fell over"):
            stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
            [chunk async for chunk in stream]
        assert channel.metrics()["engine_errors"] == 1
        with pytest.raises(openai.BadRequestError, match="maximum context length"):  # a 400, not a stream
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 400}],
                                                 stream=True)


def test_a_reply_that_starts_inside_a_think_block_the_template_opened_streams_as_reasoning():
    """Templates that open `<think>` in the prompt (Qwen3-style): the reply only closes it."""
    from agenttune.components.parsers.think import ThinkParser
    from agenttune.gateway.streaming import DeltaStream

    text = "\nweigh it up\n</think>\n\nThe answer."
    stream = DeltaStream(reasoning=ThinkParser(), tool_start=None, stops=(), prompt_opens_thinking=True)
    deltas = [delta for end in range(1, len(text) + 1) for delta in stream.push(text[:end])]
    reasoning, content = ThinkParser().split(text)
    deltas += stream.finish({"content": content, "reasoning_content": reasoning})
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == reasoning == "weigh it up"
    assert "".join(delta.get("content", "") for delta in deltas) == content == "The answer."
    assert not stream.mismatch and len(deltas) > 4
