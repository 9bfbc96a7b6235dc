"""In-process `httpx` transports: clients in the same process reach the gateway without a socket.

Both call the same handler as the HTTP server. The gateway's work (and the engine's batching)
stays on the gateway's event loop: calls from other threads or loops are handed over to it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from agenttune.gateway.server import Gateway, Reply


def _response(reply: Reply, request: httpx.Request) -> httpx.Response:
    return httpx.Response(reply.status, headers={"content-type": reply.content_type}, content=reply.body,
                          request=request)


class AsyncInProcessTransport(httpx.AsyncBaseTransport):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        call = self.gateway.handle(request.method, request.url.path, request.headers, body)
        loop = self.gateway.loop
        if loop is None or loop is asyncio.get_running_loop():
            reply = await call
        else:  # a workflow running its own loop (e.g. asyncio.run in a thread)
            reply = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, loop))
        return _response(reply, request)


class InProcessTransport(httpx.BaseTransport):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        loop = self.gateway.loop
        if loop is None or loop.is_closed():
            raise RuntimeError("The gateway is not running: `await gateway.start()` first.")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("A synchronous OpenAI client was used inside the gateway's event loop, which would "
                               "block it forever. In async code use the async client "
                               "(tuner.as_async_openai_client()), or run sync code in a thread.")
        body = request.read()
        future = asyncio.run_coroutine_threadsafe(
            self.gateway.handle(request.method, request.url.path, request.headers, body), loop)
        return _response(future.result(), request)
