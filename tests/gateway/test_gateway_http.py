"""The gateway over real loopback HTTP, with the real `openai` client (sync and async) and raw httpx."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from agenttune.components.engines.scripted import ScriptedEngine, scripted_logprob
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}]
TWO_CALLS = ('<think>\nplan\n</think>\n\nOn it.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>\n'
             '<tool_call>\n{"name": "calc", "arguments": {"x": 2}}\n</tool_call>')
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


async def test_async_openai_client_over_http_with_tools_and_streaming(tokenizer):
    engine = ScriptedEngine([TWO_CALLS, TWO_CALLS], tokenizer=tokenizer)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        assert channel.base_url.startswith("http://127.0.0.1:")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        response = await client.chat.completions.create(model="my-model", messages=USER, tools=TOOLS)
        message = response.choices[0].message
        assert response.model == "my-model" and response.choices[0].finish_reason == "tool_calls"
        assert message.content == "On it." and message.reasoning_content == "plan"
        assert [json.loads(call.function.arguments) for call in message.tool_calls] == [{"x": 1}, {"x": 2}]
        assert response.usage.completion_tokens == len(tokenizer.encode(TWO_CALLS)) + 1

        stream = await client.chat.completions.create(model="m", messages=USER, tools=TOOLS, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert content == "On it." and finish == ["tool_calls"]
        assembled = {}  # as OpenAI clients do: the id and name first, then argument fragments by index
        for call in calls:
            entry = assembled.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        assert [(entry["name"], json.loads(entry["arguments"])) for entry in assembled.values()] == [
            (call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls]
        assert calls[0].id and calls[0].function.name and calls[0].function.arguments == ""
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == response.usage.completion_tokens
        reasoning = [getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices]
        assert "".join(part or "" for part in reasoning) == "plan" and len([r for r in reasoning if r]) > 1
        await client.close()
    assert channel.metrics()["calls"] == 2


def test_sync_openai_client_over_http(tokenizer):
    engine = ScriptedEngine(["Hello there."], tokenizer=tokenizer, cycle=True)

    async def main():
        async with running_gateway(engine) as gateway:
            channel = gateway.open_episode("e1")

            def workflow():
                client = openai.OpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
                plain = client.chat.completions.create(model="m", messages=USER)
                streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
                    model="m", messages=USER, stream=True) if chunk.choices)
                return plain.choices[0].message.content, streamed

            return await asyncio.to_thread(workflow)

    assert asyncio.run(main()) == ("Hello there.", "Hello there.")


async def test_key_in_the_url_path_and_agent_names(tokenizer):
    engine = ScriptedEngine(["A"], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.path_base_url("critic"), api_key="ignored", max_retries=0)
        await client.chat.completions.create(model="m", messages=USER)
        async with httpx.AsyncClient() as http:
            reply = await http.post(f"{gateway.base_url}/chat/completions", json={"messages": USER},
                                    headers={"api-key": channel.api_key("solver")})
            assert reply.status_code == 200
    assert [sample.agent for sample in channel.samples()] == ["critic", "solver"]


async def test_request_features_are_accepted(tokenizer):
    engine = ScriptedEngine([TWO_CALLS], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        async with httpx.AsyncClient(base_url=gateway.base_url,
                                     headers={"Authorization": f"Bearer {channel.api_key()}"}) as http:
            body = {
                "model": "gpt-4o", "messages": [
                    {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]},
                    {"role": "user", "name": "alice", "content": "Hi"}],
                "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False, "max_completion_tokens": 200,
                "logprobs": True, "top_logprobs": 2, "frequency_penalty": 0.5, "user": "x", "some_future_field": {},
                "temperature": 0.3, "seed": 7, "response_format": {"type": "text"}, "n": 1,
            }
            reply = (await http.post("/chat/completions", json=body)).json()
            choice = reply["choices"][0]
            assert len(choice["message"]["tool_calls"]) == 1  # parallel_tool_calls: false keeps the first
            logprobs = choice["logprobs"]["content"]
            ids = tokenizer.encode(TWO_CALLS, add_special_tokens=False)
            assert [entry["logprob"] for entry in logprobs] == [scripted_logprob(token) for token in ids]
            assert "".join(entry["token"] for entry in logprobs) == TWO_CALLS
            prompt = tokenizer.decode(engine.prompts[-1])
            assert prompt.startswith("<|im_start|>system\nBe kind.\n\n# Tools")
            assert engine.samplings[-1].max_tokens == 200 and engine.samplings[-1].temperature == 1.0

            none = (await http.post("/chat/completions", json={**body, "tool_choice": "none"})).json()
            assert "tool_calls" not in none["choices"][0]["message"]
            assert none["choices"][0]["message"]["content"].startswith("On it.\n<tool_call>")

            models = (await http.get("/models")).json()
            assert models["data"][0]["id"] == "tiny://default"
            assert (await http.get(gateway.root_url + "/health")).json()["status"] == "ok"


@pytest.mark.parametrize("method, path, body, headers, status, code", [
    ("POST", "/v1/chat/completions", {"messages": USER}, {"Authorization": "Bearer wrong"}, 401, "invalid_api_key"),
    ("POST", "/v1/chat/completions", {"messages": USER}, {}, 401, "invalid_api_key"),
    ("POST", "/v1/chat/completions", {"messages": USER, "n": 2}, None, 400, "unsupported_value"),
    ("POST", "/v1/chat/completions", b"{not json", None, 400, "invalid_value"),
    ("POST", "/v1/chat/completions", {"messages": []}, None, 400, "invalid_value"),
    ("POST", "/v1/chat/completions", {"model": "m"}, None, 400, "missing_required_parameter"),
    ("POST", "/v1/chat/completions", {"messages": USER, "stream": "yes"}, None, 400, "invalid_type"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, None, 400, "invalid_value"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, 400,
     "invalid_value"),
    ("POST", "/v1/chat/completions", {"messages": USER, "max_tokens": 0}, None, 400, "invalid_value"),
    ("POST", "/v1/chat/completions", {"messages": USER, "tools": [{"type": "function"}]}, None, 400, "invalid_value"),
    ("GET", "/v1/chat/completions", None, None, 405, "method_not_allowed"),
    ("POST", "/v1/embeddings", {"input": "x"}, None, 404, "not_found"),
])
async def test_refusals_are_openai_error_bodies(tokenizer, method, path, body, headers, status, code):
    engine = ScriptedEngine(["A"], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        headers = {"Authorization": f"Bearer {channel.api_key()}"} if headers is None else headers
        content = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        async with httpx.AsyncClient() as http:
            if content is not None:
                headers = {**headers, "Content-Type": "application/json"}
            reply = await http.request(method, gateway.root_url + path, content=content, headers=headers)
            assert (await http.get(gateway.root_url + "/health")).status_code == 200  # still serving
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["message"] and error["type"] and error["code"] == code
    if body and isinstance(body, dict) and body.get("n") == 2:
        assert "n=2 is not supported" in error["message"]


async def test_closed_episode_keys_are_refused(tokenizer):
    engine = ScriptedEngine(["A"], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        await client.chat.completions.create(model="m", messages=USER)
        gateway.close_episode(channel)
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="m", messages=USER)
    assert channel.samples()[0].num_calls == 1  # the record outlives the key


async def test_engine_failures_are_reported_not_fatal(tokenizer):
    engine = ScriptedEngine(["only one"], tokenizer=tokenizer)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        await client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=USER)
        assert caught.value.status_code == 502 and "no reply left" in caught.value.message
    assert channel.metrics()["engine_errors"] == 1


async def test_keys_are_unguessable_and_distinct(tokenizer):
    async with running_gateway(ScriptedEngine([], tokenizer=tokenizer), http=False) as gateway:
        keys = {gateway.open_episode(f"e{i}").key for i in range(200)}
    assert len(keys) == 200 and all(len(key) >= 32 and "." not in key for key in keys)
