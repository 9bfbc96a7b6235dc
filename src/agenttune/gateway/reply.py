"""`Reply`: what the gateway's request handler answers, and the handler as its callers see it.

The in-process transports and the episode channel reach the gateway through `RequestHandler` (a
Protocol the `Gateway` in server.py meets), so neither imports the server, which imports the
channel and this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

JSON = "application/json"
EVENTS = "text/event-stream"


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    stream: AsyncIterator[bytes] | None = None  # a streamed reply's events (then `body` is empty)

    async def read(self) -> bytes:
        """The whole body (a stream is read to its end)."""
        if self.stream is None:
            return self.body
        return b"".join([chunk async for chunk in self.stream])


class RequestHandler(Protocol):
    """The gateway's request handler and the event loop it runs on (`agenttune.gateway.Gateway`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    async def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply:
        """Answer one HTTP request. Never raises (but for cancellation): refusals are error bodies."""
        ...
