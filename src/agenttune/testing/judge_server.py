"""A scripted OpenAI-compatible `/v1/chat/completions` server, for testing LLM judges and their clients.

    server = ScriptedChatServer([Reply(status=503), Reply("Score: 8")])
    with server.serving() as base_url:          # "http://127.0.0.1:PORT/v1"
        ...                                      # the first request gets a 503, the second a reply
    server.requests                              # the JSON bodies received, in order

Each request takes the next scripted reply; when the script runs out the server answers 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agenttune.testing.loopback import serve_app


@dataclass
class Reply:
    """One scripted answer: a chat completion with `content`, or an error `status`, after `delay` s."""

    content: str | None = None
    status: int = 200
    delay: float = 0.0


@dataclass
class ScriptedChatServer:
    script: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def completions(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        reply = self.script.pop(0) if self.script else Reply(status=500)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=reply.status)
        return JSONResponse({
            "id": f"cmpl-{len(self.requests)}", "object": "chat.completion", "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": reply.content}}],
        })

    @contextmanager
    def serving(self) -> Iterator[str]:
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])
        with serve_app(app) as url:
            yield f"{url}/v1"
