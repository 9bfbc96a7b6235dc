"""Fuzzing the gateway where tests/gateway/test_gateway_fuzz.py does not reach: any Unicode (lone surrogates
included), any nesting depth, any token ids from the model, and abuse of the HTTP connection itself.

The properties: never a 5xx, every answer is valid UTF-8 JSON (or SSE), and the server keeps
answering `/health` afterwards. Each found bug is pinned by an explicit example as well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agenttune.components.engines.base import Generation
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.gateway import Gateway
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config

TOKENIZER = tiny_tokenizer()
MAX_TOKENS = 48
any_text = st.text(st.characters(blacklist_categories=()), max_size=24)  # surrogates and controls included


@dataclass
class LiveGateway:
    gateway: Gateway
    loop: asyncio.AbstractEventLoop
    engine: ScriptedEngine

    def handle(self, body: bytes, key: str | None = None, path: str = "/v1/chat/completions") -> Any:
        headers = {"authorization": f"Bearer {key}"} if key else {}

        async def whole() -> Any:  # a streamed reply read to its end, as a client would
            reply = await self.gateway.handle("POST", path, headers, body)
            return dataclasses.replace(reply, body=await reply.read(), stream=None)

        return asyncio.run_coroutine_threadsafe(whole(), self.loop).result(timeout=60)

    def open(self) -> str:
        return self.gateway.open_episode("fuzz").key

    def healthy(self) -> bool:
        return httpx.get(f"{self.gateway.root_url}/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def live() -> Iterator[LiveGateway]:
    """A gateway serving HTTP from its own event-loop thread; the model's replies are set per test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = ScriptedEngine(["Hello."], tokenizer=TOKENIZER, cycle=True)
    config = tiny_config(model={"max_model_len": 4096}, rollout={"max_response_length_in_one_turn": MAX_TOKENS})
    gateway = Gateway(engine, TOKENIZER, config)
    asyncio.run_coroutine_threadsafe(gateway.start(), loop).result(timeout=30)
    yield LiveGateway(gateway, loop, engine)
    asyncio.run_coroutine_threadsafe(gateway.stop(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def check_reply(reply: Any) -> dict | None:
    """No 5xx; the body is valid UTF-8 JSON (or SSE ending in [DONE]). Returns the JSON, if any."""
    assert reply.status < 500, reply.body[:500]
    text = reply.body.decode("utf-8")  # strict: a reply must be valid UTF-8
    if reply.content_type.startswith("text/event-stream"):
        assert text.endswith("data: [DONE]\n\n")
        return None
    payload = json.loads(text)
    if reply.status >= 400:
        assert payload["error"]["message"]
    return payload


# -- any Unicode in every string field ------------------------------------------------------------------
def request_with(text: dict[str, str]) -> dict[str, Any]:
    tool = text["tool"] or "calc"
    return {
        "model": text["model"],
        "messages": [
            {"role": "system", "content": text["system"]},
            {"role": "user", "content": [{"type": "text", "text": text["user"]}], "name": text["name"]},
            {"role": "assistant", "content": text["reply"], "reasoning_content": text["reasoning"],
             "tool_calls": [{"id": text["call_id"], "type": "function",
                             "function": {"name": tool, "arguments": text["arguments"]}}]},
            {"role": "tool", "tool_call_id": text["call_id"], "content": text["result"]},
        ],
        "tools": [{"type": "function", "function": {"name": tool, "description": text["description"],
                                                    "parameters": {"type": "object", "properties": {
                                                        text["property"]: {"type": "string"}}}}}],
        "stop": [text["stop"]],
        "chat_template_kwargs": {"enable_thinking": text["flag"]},
    }


FIELDS = ["model", "system", "user", "name", "reply", "reasoning", "call_id", "tool", "arguments", "result",
          "description", "property", "stop", "flag"]


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.fixed_dictionaries({field: any_text for field in FIELDS}), agent=any_text,
       ascii_only=st.booleans())
@example(text={field: "\ud800" if field == "user" else "x" for field in FIELDS}, agent="", ascii_only=True)
@example(text={field: "x" for field in FIELDS}, agent="\udfff", ascii_only=True)
def test_any_unicode_in_any_field_is_answered_or_refused_never_a_crash(live, text, agent, ascii_only):
    body = json.dumps(request_with(text), ensure_ascii=ascii_only)
    try:
        raw = body.encode("utf-8")
    except UnicodeEncodeError:  # raw surrogates: what a client that writes them as bytes sends
        raw = body.encode("utf-8", "surrogatepass")
    key = f"{live.open()}.{agent}" if agent else live.open()
    check_reply(live.handle(raw, key))


def test_lone_surrogates_are_a_clear_400_and_paired_ones_are_text(live):
    key = live.open()
    lone = b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}'
    refused = check_reply(live.handle(lone, key))
    assert "surrogate" in refused["error"]["message"]
    paired = b'{"messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}'  # an escaped emoji
    assert check_reply(live.handle(paired, key))["choices"][0]["message"]["role"] == "assistant"
    korean = json.dumps({"messages": [{"role": "user", "content": "\ud55c\uad6d\uc5b4"}]}, ensure_ascii=False)
    assert live.handle(korean.encode(), key).status == 200  # raw bytes 0xED 0x95 ...: real text


# -- nesting depth ---------------------------------------------------------------------------------------------
def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


PLACES = {
    "whole body": lambda deep: deep,
    "message content": lambda deep: {"messages": [{"role": "user", "content": deep}]},
    "tool parameters": lambda deep: {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "default": deep}}}]},
    "tool-call arguments": lambda deep: {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                             "function": {"name": "calc", "arguments": {"a": deep}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "1"}]},
    "template kwargs": lambda deep: {"messages": [{"role": "user", "content": "hi"}],
                                     "chat_template_kwargs": {"deep": deep}},
    "unknown field": lambda deep: {"messages": [{"role": "user", "content": "hi"}], "extra": deep},
}


@pytest.mark.parametrize("depth", [50, 900, 1500, 100_000])
@pytest.mark.parametrize("place", list(PLACES))
def test_any_nesting_depth_is_answered_or_refused(live, place, depth):
    # json.dumps cannot write what json.loads refuses; build the text by hand.
    body = json.dumps(PLACES[place]("@DEEP@")).replace('"@DEEP@"', "[" * depth + '"x"' + "]" * depth)
    check_reply(live.handle(body.encode(), live.open()))
    assert live.healthy()


# -- any token ids from the model ------------------------------------------------------------------------------
special = [TOKENIZER.convert_tokens_to_ids(token) for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                               "<tool_call>", "</tool_call>", "<think>", "</think>")]
token_ids = st.lists(st.integers(0, len(TOKENIZER) - 1) | st.sampled_from(special), max_size=80)
escapes = st.sampled_from(['"\\ud800"', '"\\udfff\\ud800"', '"\\ud83d\\ude00"', '"\\u0000"', "[[[[[[[[", "1e999",
                           "NaN", '"' + "\\\\" * 3 + '"', "{}", "null"])


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=token_ids, text_call=st.none() | escapes, tools=st.booleans(), stream=st.booleans(),
       logprobs=st.booleans(), finish=st.sampled_from(["stop", "length", "abort"]))
@example(ids=[], text_call='"\\ud800"', tools=True, stream=False, logprobs=False, finish="stop")
def test_any_model_output_is_answered(live, ids, text_call, tools, stream, logprobs, finish):
    if text_call is not None:  # a tool call whose JSON holds an odd literal, e.g. an unpaired \ud800 escape
        call = f'<tool_call>\n{{"name": {text_call}, "arguments": {{"x": {text_call}}}}}\n</tool_call>'
        ids = ids + TOKENIZER.encode(call, add_special_tokens=False)
    generation = Generation(ids[:MAX_TOKENS], [-1.0] * len(ids[:MAX_TOKENS]), finish)
    live.engine.responder = lambda prompt, sampling: generation
    try:
        key = live.open()
        body = {"messages": [{"role": "user", "content": "Say anything."}], "stream": stream, "logprobs": logprobs}
        if tools:
            body["tools"] = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
        payload = check_reply(live.handle(json.dumps(body).encode(), key))
    finally:
        live.engine.responder = None
    channel = live.gateway._channels[key]
    if payload is not None and generation.token_ids:  # the ids are kept exactly as the model made them
        assert channel.samples()[0].response_ids == generation.token_ids


# -- the HTTP connection itself --------------------------------------------------------------------------------
def raw_exchange(live: LiveGateway, data: bytes, *, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", live.gateway.port), timeout=10) as sock:
        sock.sendall(data)
        if not read:
            return b""
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


ABUSE = {
    "not HTTP at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),
    "truncated body": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{\"messages\": [",
    "invalid UTF-8 header": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3\r\n"
                            b"Content-Length: 2\r\n\r\n{}",
    "huge header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    "path traversal with a key": b"GET /e/../../etc/passwd/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "percent-encoded garbage path": b"POST /e/%00%ff%2F..%2F/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: 2\r\n\r\n{}",
    "chunked body that lies": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"ffff\r\nabc\r\n0\r\n\r\n",
    "hang up mid-request": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess",
}


@pytest.mark.parametrize("name", list(ABUSE))
def test_connection_abuse_never_kills_the_server(live, name):
    answer = raw_exchange(live, ABUSE[name], read=name != "hang up mid-request")
    if answer.startswith(b"HTTP/1.1 "):
        assert not answer.startswith(b"HTTP/1.1 5"), answer[:300]
    assert live.healthy()


@pytest.mark.slow
def test_a_client_that_leaves_during_a_slow_generation_does_not_hurt_the_next(live):
    live.engine.delay = 0.5
    try:
        key = live.open()
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        raw_exchange(live, head + body, read=False)  # sends, then hangs up before the answer
        reply = httpx.post(f"{live.gateway.base_url}/chat/completions", json=json.loads(body),
                           headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert reply.status_code == 200, reply.text
    finally:
        live.engine.delay = 0.0
    assert live.healthy()
