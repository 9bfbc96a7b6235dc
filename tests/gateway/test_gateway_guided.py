"""tool_choice and response_format, enforced while decoding (issue 23 item 2).

The tiny model has random weights: left alone it almost never writes a tool call or JSON. With a
guide it must, every time; the tokens the grammar forced are not trained on; the logprobs are
those of the masked distribution the tokens were drawn from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import jsonschema
import openai
import pytest

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.gateway.protocol import parse_chat_request
from agenttune.registry.resolution import build_engine
from agenttune.testing.gateways import running_gateway, tiny_config

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["city", "days"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"query": {"enum": ["cats", "dogs"]}},
                                     "required": ["query"], "additionalProperties": False}}}
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                                                 "sure": {"type": "boolean"}},
                 "required": ["answer", "sure"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
REPEATS = 12


@contextlib.asynccontextmanager
async def serving(tiny_model, tiny_tokenizer, max_tokens: int):
    config = tiny_config(rollout={"max_response_length_in_one_turn": max_tokens, "temperature": 1.0,
                                  "max_turns": 99})
    engine = build_engine(config, tiny_tokenizer, model=tiny_model)
    async with running_gateway(engine, config=config) as gateway:
        yield gateway
    await engine.aclose()


@pytest.fixture
async def gateway(tiny_model, tiny_tokenizer):
    async with serving(tiny_model, tiny_tokenizer, 256) as gateway:
        yield gateway


@pytest.fixture
async def roomy_gateway(tiny_model, tiny_tokenizer):
    """`tool_choice: required` with parallel calls lets the random-weights model add call after call:
    in 600 replies 1 to 8 calls, each count about a third as frequent as the one before. 256 tokens
    hold about five calls, and 4 of 600 replies ran out of tokens there (a failure in ~8 % of runs of
    12 episodes); 2048 tokens hold about fifty."""
    async with serving(tiny_model, tiny_tokenizer, 2048) as gateway:
        yield gateway


def client_for(channel) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                              http_client=httpx.AsyncClient(transport=channel.async_transport()))


async def ask(gateway, count: int = REPEATS, **body):
    """`count` episodes of one call each; returns (replies, channels)."""
    channels = [gateway.open_episode(f"e{index}") for index in range(count)]
    replies = await asyncio.gather(*(client_for(channel).chat.completions.create(
        model="m", messages=MESSAGES, **body) for channel in channels))
    return replies, channels


def check_calls(calls, tools):
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


async def test_unguided_the_tiny_model_does_not_call_tools(gateway):
    """The baseline that makes the other tests mean something."""
    replies, _ = await ask(gateway, tools=[WEATHER, SEARCH])
    assert sum(bool(reply.choices[0].message.tool_calls) for reply in replies) <= 1


async def test_tool_choice_required_always_returns_valid_tool_calls(roomy_gateway):
    replies, channels = await ask(roomy_gateway, tools=[WEATHER, SEARCH], tool_choice="required")
    for reply, channel in zip(replies, channels, strict=True):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message
        check_calls(choice.message.tool_calls, [WEATHER, SEARCH])
        assert channel.metrics()["tool_call_errors"] == 0


async def test_a_named_function_and_parallel_tool_calls_false_give_exactly_one_call_of_it(gateway):
    named = {"type": "function", "function": {"name": "search"}}
    replies, _ = await ask(gateway, tools=[WEATHER, SEARCH], tool_choice=named)
    for reply in replies:
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "search" and json.loads(call.function.arguments)["query"] in ("cats", "dogs")
    replies, _ = await ask(gateway, tools=[WEATHER, SEARCH], tool_choice="required", parallel_tool_calls=False)
    for reply in replies:
        assert len(reply.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}},
    {"type": "json_object"}], ids=["json_schema", "json_object"])
async def test_response_format_replies_parse_and_validate(gateway, response_format):
    replies, _ = await ask(gateway, response_format=response_format)
    schema = response_format.get("json_schema", {}).get("schema", {"type": "object"})
    for reply in replies:
        content = reply.choices[0].message.content
        assert content.startswith("{")
        if reply.choices[0].finish_reason == "stop" or "json_schema" in response_format:
            jsonschema.validate(json.loads(content), schema)
        # (json_object leaves keys and strings unbounded: the random-weights model may run out of
        # tokens inside one; a schema that bounds them always finishes.)


async def test_forced_tokens_are_not_trained_and_logprobs_are_the_masked_distributions(gateway, tiny_model):
    """A named function forces its whole call prefix: loss mask 0 there; sampled tokens keep mask 1 and
    a logprob from the renormalised (masked) distribution, >= the model's own logprob for the token."""
    import torch

    named = {"type": "function", "function": {"name": "get_weather"}}
    [reply], [channel] = await ask(gateway, count=1, tools=[WEATHER], tool_choice=named)
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    [sample] = channel.samples()
    # The grammar fixes the call's text, not its tokenization: where it left one token, that token is
    # forced (mask 0, logprob 0: probability 1 under the masked distribution).
    assert gateway.renderer.decode(sample.response_ids).startswith('<tool_call>\n{"name": "get_weather", ')
    forced = [position for position, mask in enumerate(sample.loss_mask) if not mask]
    assert forced
    assert [sample.logprobs[position] for position in forced] == pytest.approx([0.0] * len(forced), abs=1e-6)
    assert channel.metrics()["forced_tokens"] == len(forced) < len(sample.response_ids)
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        own = torch.log_softmax(tiny_model(ids).logits[0].float(), -1)
    start = len(sample.prompt_ids)
    for position, (token, mask, logprob) in enumerate(zip(sample.response_ids, sample.loss_mask, sample.logprobs,
                                                          strict=True)):
        if mask:  # masking renormalises over fewer tokens: never less likely than unmasked
            assert logprob < 0 and logprob >= own[start + position - 1, token].item() - 1e-4
    # Exactly the distribution sampled from: replay the grammar independently (a fresh xgrammar matcher
    # on the same guide), mask the teacher-forced logits, renormalise (temperature 1), compare.
    import xgrammar

    sampling = gateway.completions._sampling(channel, parse_chat_request(
        {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": named}))
    book = gateway.engine.grammars
    matcher, logits = book.matcher(sampling.guide), tiny_model(ids).logits[0].float().detach()
    bitmask = xgrammar.allocate_token_bitmask(1, book.vocab_size)
    for position, token in enumerate(sample.response_ids):
        row = logits[start + position - 1].clone()[None, : book.vocab_size].contiguous()
        matcher.fill_next_token_bitmask(bitmask)
        xgrammar.apply_token_bitmask_inplace(row, bitmask)
        expected = torch.log_softmax(row[0], -1)[token].item()
        assert sample.logprobs[position] == pytest.approx(expected, abs=1e-4)
        assert matcher.accept_token(token)


async def test_an_impossible_tool_choice_is_a_clear_400(gateway):
    channel = gateway.open_episode("bad")
    client = client_for(channel)
    with pytest.raises(openai.BadRequestError, match="not among 'tools'"):
        await client.chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER],
                                             tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="needs 'tools'"):
        await client.chat.completions.create(model="m", messages=MESSAGES, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="response_format"):
        await client.chat.completions.create(model="m", messages=MESSAGES, response_format={"type": "xml"})


async def test_engines_that_cannot_enforce_a_guide_count_it(tiny_tokenizer):
    engine = ScriptedEngine(["plain text"], tokenizer=tiny_tokenizer, cycle=True)
    async with running_gateway(engine, config=tiny_config()) as gateway:
        channel = gateway.open_episode("e")
        reply = await client_for(channel).chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER],
                                                                 tool_choice="required")
    assert reply.choices[0].message.content == "plain text"
    assert channel.metrics()["guide_not_enforced"] == 1


async def test_a_reply_cut_off_inside_a_call_keeps_the_calls_it_finished(tiny_tokenizer):
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
    cut = first + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    engine = ScriptedEngine([first + "\n" + first], tokenizer=tiny_tokenizer)
    async with running_gateway(engine, config=tiny_config()) as gateway:
        channel = gateway.open_episode("e")
        reply = await client_for(channel).chat.completions.create(  # the budget ends inside the second call
            model="m", messages=MESSAGES, tools=[WEATHER], max_tokens=len(tiny_tokenizer.encode(cut)))
    assert reply.choices[0].finish_reason == "length"
    [call] = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Rome", "days": 2}
    assert channel.metrics()["tool_call_errors"] == 1  # the cut call: still a madness signal
