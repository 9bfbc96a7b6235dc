"""The in-process transports: a client reads the gateway's replies as it would from a socket.

That means `response.elapsed` is set (the openai SDK exposes it), streams read to the end, and a
call leaves no reference cycle behind: with a hundred episodes on one event loop, cyclic garbage
is freed only by collections that pause every episode for tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc

import httpx
import openai
import pytest

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


@contextlib.contextmanager
def cyclic_garbage():
    """Collects what the block leaves for the garbage collector (objects in reference cycles)."""
    found: list[object] = []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found += gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def gateway_objects(objects: list[object]) -> list[str]:
    """The httpx and agenttune objects among `objects`, less those of requests to hosts other than the tests'
    `http://g`: the collector gathers every thread's garbage, and a client elsewhere in the test process (an
    SDK's heartbeat retrying a server an earlier test stopped, say) leaves requests in cycles of its own."""
    others = [item for item in objects if isinstance(item, httpx.Request) and item.url.host != "g"]
    theirs = {id(part) for request in others for part in (request, request.url, request.url._uri_reference,
                                                          request.headers, request.stream)}
    return sorted({type(item).__qualname__ for item in objects
                   if type(item).__module__.split(".")[0] in ("httpx", "agenttune") and id(item) not in theirs})


@pytest.mark.slow
def test_async_client_replies_have_elapsed_and_leave_no_cycles():
    engine = ScriptedEngine(["Hello."] * 4, tokenizer=tiny_tokenizer())

    async def main():
        async with running_gateway(engine, http=False) as gateway:
            channel = gateway.open_episode("e1")
            headers = {"authorization": f"Bearer {channel.api_key()}"}
            async with httpx.AsyncClient(transport=channel.async_transport(), base_url="http://g") as client:
                await client.post("/v1/chat/completions", json=CHAT, headers=headers)  # warm: lazy imports
                with cyclic_garbage() as garbage:
                    response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
                    assert response.json()["choices"][0]["message"]["content"] == "Hello."
                    assert isinstance(response.elapsed, datetime.timedelta)
                    del response
                assert gateway_objects(garbage) == []

                body = {**CHAT, "stream": True}
                async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as streamed:
                    lines = [line async for line in streamed.aiter_lines() if line]
                assert lines[-1] == "data: [DONE]" and streamed.is_closed
                assert isinstance(streamed.elapsed, datetime.timedelta)

            sdk = openai.AsyncOpenAI(base_url="http://g/v1", api_key=channel.api_key(), max_retries=0,
                                     http_client=httpx.AsyncClient(transport=channel.async_transport()))
            raw = await sdk.chat.completions.with_raw_response.create(**CHAT)
            assert raw.parse().choices[0].message.content == "Hello."
            assert isinstance(raw.elapsed, datetime.timedelta)

    asyncio.run(main())


@pytest.mark.slow
def test_sync_client_replies_have_elapsed_and_leave_no_cycles():
    engine = ScriptedEngine(["Hello."] * 2, tokenizer=tiny_tokenizer())

    async def main():
        async with running_gateway(engine, http=False) as gateway:
            channel = gateway.open_episode("e1")

            def workflow() -> list[str]:
                with httpx.Client(transport=channel.transport(), base_url="http://g",
                                  headers={"authorization": f"Bearer {channel.api_key()}"}) as client:
                    client.post("/v1/chat/completions", json=CHAT)
                    with cyclic_garbage() as garbage:
                        response = client.post("/v1/chat/completions", json=CHAT)
                        assert response.json()["choices"][0]["message"]["content"] == "Hello."
                        assert isinstance(response.elapsed, datetime.timedelta)
                        del response
                return gateway_objects(garbage)

            assert await asyncio.to_thread(workflow) == []

    asyncio.run(main())
