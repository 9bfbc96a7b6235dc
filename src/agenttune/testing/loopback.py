"""Serve an ASGI app (starlette, FastAPI) on a free loopback port for the length of a test.

    with serve_app(app) as base_url:      # "http://127.0.0.1:PORT"
        httpx.get(base_url + "/healthz")

The server runs in a daemon thread of the test process: a real HTTP server, reachable from any
client, stopped (and its port freed) when the block ends.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_app(app: Any, *, startup_timeout: float = 10.0) -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"agenttune-test-server-{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
