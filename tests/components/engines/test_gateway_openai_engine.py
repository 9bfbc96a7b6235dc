"""The `openai` engine against a stand-in for a vLLM server on loopback (vLLM itself needs a GPU)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.openai import OpenAIEngine
from agenttune.errors import UserError
from agenttune.gateway import Gateway
from agenttune.registry.resolution import build_engine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config
from agenttune.testing.loopback import serve_app

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
REPLIES = ['<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', "Done."]


class FakeVLLM:
    """Answers like `vllm serve`: token-id prompts on /v1/completions, return_token_ids on both routes."""

    def __init__(self, tokenizer, *, token_ids: bool = True):
        self.tokenizer = tokenizer
        self.token_ids = token_ids
        self.requests: list[dict] = []
        self.turn = 0

    def _reply(self) -> list[int]:
        text = REPLIES[self.turn % len(REPLIES)]
        self.turn += 1
        return self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        ids = self._reply()
        if body.get("stream"):  # vLLM: one chunk per token, its ids with return_token_ids, then [DONE]
            return StreamingResponse(self._chunks(ids, body), media_type="text/event-stream")
        choice = {"index": 0, "text": self.tokenizer.decode(ids, skip_special_tokens=True), "finish_reason": "stop",
                  "logprobs": {"token_logprobs": [-0.25] * len(ids), "tokens": []}}
        if self.token_ids and body.get("return_token_ids"):
            choice |= {"token_ids": ids, "prompt_token_ids": body["prompt"]}
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})

    async def _chunks(self, ids, body):
        for position, token in enumerate(ids):
            choice = {"index": 0, "text": self.tokenizer.decode([token], skip_special_tokens=True),
                      "logprobs": {"token_logprobs": [-0.25]},
                      "finish_reason": "stop" if position == len(ids) - 1 else None}
            if self.token_ids and body.get("return_token_ids"):
                choice["token_ids"] = [token]
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [choice]})}\n\n"
            await asyncio.sleep(0)
        yield "data: [DONE]\n\n"

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        ids = self._reply()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        message = {"role": "assistant", "content": text}
        if text.startswith("<tool_call>"):  # a server with --tool-call-parser hermes
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}]}
        reply = {"id": "chat-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": "stop"}]}
        if self.token_ids and body.get("return_token_ids"):
            prompt = self.tokenizer.apply_chat_template(body["messages"], tools=body.get("tools"),
                                                        add_generation_prompt=True, tokenize=False)
            reply["prompt_token_ids"] = self.tokenizer.encode(prompt, add_special_tokens=False)
            reply["choices"][0]["token_ids"] = ids
        if body.get("logprobs"):  # vLLM: one entry per generated token
            reply["choices"][0]["logprobs"] = {"content": [{"token": "", "logprob": -0.25} for _ in ids]}
        return JSONResponse(reply)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                 Route("/v1/chat/completions", self.chat, methods=["POST"])])


async def converse(fake: FakeVLLM, **engine_options):
    """A tool call and its answer, through a gateway whose `openai` engine talks to `fake` over HTTP."""
    with serve_app(fake.app()) as server_url:
        config = tiny_config(engine={"type": "openai", "base_url": server_url + "/v1", **engine_options})
        engine = build_engine(config, fake.tokenizer)
        async with Gateway(engine, fake.tokenizer, config) as gateway:
            channel = gateway.open_episode("e1")
            first, second = await call_the_tool(channel)
        await engine.aclose()
    return channel, first, second


async def call_the_tool(channel):
    client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                http_client=httpx.AsyncClient(transport=channel.async_transport()))
    messages = [{"role": "user", "content": "Compute"}]
    first = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    messages += [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    second = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    return first, second


@pytest.mark.parametrize("token_ids", [True, False])
async def test_completions_mode_sends_exact_prompt_ids(token_ids):
    tokenizer = tiny_tokenizer()
    fake = FakeVLLM(tokenizer, token_ids=token_ids)
    channel, first, second = await converse(fake, model="served")
    assert first.tool_calls[0].function.name == "calc" and second.content == "Done."
    assert fake.requests[0]["model"] == "served" and fake.requests[0]["return_token_ids"] is True
    assert fake.requests[0]["max_tokens"] == 512 and fake.requests[0]["stop_token_ids"] == [tokenizer.eos_token_id]
    if token_ids:  # exact: the second prompt is the merged context, one trainable sample
        [sample] = channel.samples()
        assert channel.trainable and sample.num_calls == 2
        assert fake.requests[1]["prompt"] == sample.prompt_ids + sample.response_ids[: len(fake.requests[1]["prompt"])
                                                                                       - len(sample.prompt_ids)]
        assert [lp for lp, mask in zip(sample.logprobs, sample.loss_mask, strict=True) if mask] == [-0.25] * sum(
            sample.loss_mask)
    else:  # text only: kept for the log, not trainable
        assert not channel.trainable and all(not sample.trainable for sample in channel.samples())


@pytest.mark.parametrize("token_ids", [True, False])
async def test_chat_mode_forwards_messages(token_ids):
    tokenizer = tiny_tokenizer()
    fake = FakeVLLM(tokenizer, token_ids=token_ids)
    channel, first, second = await converse(fake, mode="chat")
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "Compute"}]
    assert fake.requests[0]["tools"] == TOOLS and fake.requests[0]["model"] == "tiny://default"
    assert first.tool_calls[0].function.arguments == '{"x": 1}' and second.content == "Done."
    samples = channel.samples()
    assert len(samples) == 2  # the server renders each prompt: calls cannot be merged
    assert channel.trainable is token_ids and all(sample.trainable is token_ids for sample in samples)
    if token_ids:
        assert samples[0].response_ids == tokenizer.encode(REPLIES[0], add_special_tokens=False) + [
            tokenizer.eos_token_id]
        assert samples[0].logprobs == [-0.25] * len(samples[0].response_ids)


async def test_server_errors_become_engine_errors():
    tokenizer = tiny_tokenizer()
    engine = OpenAIEngine(OpenAIEngine.Options(base_url="http://127.0.0.1:9/v1"), "m",
                          transport=httpx.MockTransport(lambda request: httpx.Response(500, text="boom")))
    config = tiny_config()
    async with Gateway(engine, tokenizer, config) as gateway:
        channel = gateway.open_episode("e1")
        async with httpx.AsyncClient(transport=channel.async_transport(), base_url="http://g") as client:
            reply = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                                      headers={"Authorization": f"Bearer {channel.key}"})
    assert reply.status_code == 502 and "answered 500: boom" in reply.json()["error"]["message"]
    assert channel.metrics()["engine_errors"] == 1


def test_openai_engine_needs_a_model_name():
    with pytest.raises(UserError, match="engine.model is not set"):
        build_engine(tiny_config(model={"path": ""}, engine={"type": "openai"}), tiny_tokenizer())


async def test_tool_choice_and_response_format_go_to_the_server_as_structured_outputs():
    """Issue 23: the openai engine passes the gateway's guide on as vLLM's `structured_outputs`."""
    fake = FakeVLLM(tiny_tokenizer())
    with serve_app(fake.app()) as server_url:
        config = tiny_config(engine={"type": "openai", "base_url": server_url + "/v1", "model": "served"})
        engine = build_engine(config, fake.tokenizer)
        async with Gateway(engine, fake.tokenizer, config) as gateway:
            channel = gateway.open_episode("e1")
            client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                        http_client=httpx.AsyncClient(transport=channel.async_transport()))
            messages = [{"role": "user", "content": "Compute"}]
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required")
            await client.chat.completions.create(model="m", messages=messages, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await engine.aclose()
    required, formatted, free = (request.get("structured_outputs") for request in fake.requests)
    tag = json.loads(required["structural_tag"])["format"]
    assert tag["type"] == "tags_with_separator" and tag["at_least_one"]
    assert tag["tags"][0]["begin"] == '<tool_call>\n{"name": "calc", "arguments": '
    assert json.loads(formatted["structural_tag"])["format"]["json_schema"] == {"type": "object"}
    assert free is None and channel.metrics().get("guide_not_enforced", 0) == 0


@pytest.mark.parametrize("token_ids", [True, False])
async def test_completions_mode_streams_what_the_server_streams(token_ids):
    """Issue 23: the openai engine passes the server's stream through, token ids and logprobs exact."""
    fake = FakeVLLM(tiny_tokenizer(), token_ids=token_ids)
    with serve_app(fake.app()) as server_url:
        config = tiny_config(engine={"type": "openai", "base_url": server_url + "/v1", "model": "served"})
        engine = build_engine(config, fake.tokenizer)
        prompt = fake.tokenizer.encode("Hello", add_special_tokens=False)
        events = [event async for event in engine.generate_stream(prompt, SamplingParams(max_tokens=64))]
        await engine.aclose()
    *deltas, generation = events
    expected = fake.tokenizer.encode(REPLIES[0], add_special_tokens=False) + [fake.tokenizer.eos_token_id]
    assert fake.requests[0]["stream"] is True and fake.requests[0]["prompt"] == prompt
    if token_ids:
        assert deltas == [[token] for token in expected]  # one chunk per token, as the server sent them
        assert generation.token_ids == expected and generation.logprobs == [-0.25] * len(expected)
    else:  # a server that streams text only: the text is kept, the episode will not be trainable
        assert deltas == [] and generation.token_ids == [] and "calc" in generation.text
    assert generation.finish_reason == "stop"
