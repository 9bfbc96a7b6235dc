"""In-process `httpx` transports: clients in the same process reach the gateway without a socket.

Both call the same handler as the HTTP server. The gateway's work (and the engine's batching)
stays on the gateway's event loop: calls from other threads or loops are handed over to it.
"""

from __future__ import annotations

import asyncio

import httpx

from agenttune.gateway.reply import Reply, RequestHandler


class _Response(httpx.Response):
    """A reply the client reads as it would from a socket, and whose stream is let go once closed.

    Built on a stream (not `content=`, which httpx reads at once) so that the client's own reading
    closes it: that is when httpx sets `response.elapsed`, which clients such as the openai SDK
    expose. The client wraps the stream in one that points back at the response; once closed that
    cycle is broken here, or it would be left to the garbage collector, whose collections pause
    every episode on the event loop for tens of milliseconds at a hundred concurrent episodes.
    """

    async def aclose(self) -> None:
        await super().aclose()
        self.stream = _DRAINED

    def close(self) -> None:
        super().close()
        self.stream = _DRAINED


_DRAINED = httpx.ByteStream(b"")  # a sync and an async stream at once, with nothing left in it


def _response(reply: Reply, request: httpx.Request) -> httpx.Response:
    if reply.stream is not None:  # read as it is written, like chunked transfer over a socket
        return _Response(reply.status, headers={"content-type": reply.content_type},
                         stream=_EventStream(reply.stream), request=request)
    headers = {"content-type": reply.content_type, "content-length": str(len(reply.body))}
    return _Response(reply.status, headers=headers, stream=httpx.ByteStream(reply.body), request=request)


class _EventStream(httpx.AsyncByteStream):
    def __init__(self, events):
        self.events = events

    async def __aiter__(self):
        async for chunk in self.events:
            yield chunk

    async def aclose(self) -> None:
        await self.events.aclose()  # a client that stops reading abandons the generation


async def _whole(call) -> Reply:
    """The reply with a stream read to its end, on the gateway's loop (for clients on other loops or threads)."""
    reply = await call
    if reply.stream is None:
        return reply
    return Reply(reply.status, await reply.read(), reply.content_type)


class AsyncInProcessTransport(httpx.AsyncBaseTransport):
    def __init__(self, gateway: RequestHandler):
        self.gateway = gateway

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        call = self.gateway.handle(request.method, request.url.path, request.headers, body)
        loop = self.gateway.loop
        if loop is None or loop is asyncio.get_running_loop():
            reply = await call
        else:  # a workflow running its own loop (e.g. asyncio.run in a thread): streams arrive whole
            reply = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_whole(call), loop))
        return _response(reply, request)


class InProcessTransport(httpx.BaseTransport):
    def __init__(self, gateway: RequestHandler):
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
        future = asyncio.run_coroutine_threadsafe(  # (a stream arrives whole: sync clients block anyway)
            _whole(self.gateway.handle(request.method, request.url.path, request.headers, body)), loop)
        return _response(future.result(), request)
