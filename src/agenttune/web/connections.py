"""uvicorn with every connection bounded in time and in number.

uvicorn by itself times out only a keep-alive connection that is idle *after* a response: a socket
that never sends a byte, or sends a request one byte at a time (slowloris), stays open for ever, and
its `limit_concurrency` answers 503 only once a request's headers are in, so idle sockets still
pile up until the process runs out of file descriptors. Here:

- a connection must deliver a whole request (headers and body) within `request_timeout_s` of
  opening, or of its first byte after a keep-alive wait; otherwise it gets 408 and is closed.
  Once the request is in, the answer may take as long as it takes (a long generation);
- a request line and headers longer than `MAX_HEAD_BYTES` get 431 and the connection is closed
  (httptools collects a header by concatenating its pieces: a header of megabytes would cost
  the event loop quadratic time, and memory);
- beyond `max_connections` open connections (at most 3/4 of the process's file-descriptor limit),
  a new connection is answered 503 at once and closed;
- the warnings of both, of uvicorn's per-request ones and of the accept loop running out of file
  descriptors are rate-limited: one per condition per minute, never a traceback per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from typing import Any

from agenttune.web.limits import WARNINGS, ServerLimits, error_body

MAX_HEAD_BYTES = 64 * 1024  # request line and headers
REFUSED_LINGER_S = 1.0  # how long a refused connection may still read (and drop) what the client sent
FD_RESERVE_FRACTION = 0.75  # the connections may use at most this share of the file-descriptor limit


def _raw_response(status: str, message: str, code: str, type: str = "invalid_request_error") -> bytes:
    body = error_body(message, code=code, type=type)
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def _auto_protocol() -> type:
    """uvicorn's choice: httptools when installed (a dependency of agenttune), else h11."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return AutoHTTPProtocol


def guarded_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with `limits`' request timeout and connection cap."""
    base: Any = _auto_protocol()
    cap = connection_cap(limits.max_connections)
    timeout_response = _raw_response(
        "408 Request Timeout", f"The request did not arrive within {limits.request_timeout_s:g} s.",
        "request_timeout")
    head_response = _raw_response(
        "431 Request Header Fields Too Large", f"The request line and headers are longer than {MAX_HEAD_BYTES // 1024} "
        "KiB.", "request_header_fields_too_large")
    busy_response = _raw_response(
        "503 Service Unavailable", f"The server has {cap} open connections, its limit; try again shortly.",
        "too_many_connections", type="server_error")

    class GuardedProtocol(base):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = limits.keep_alive_timeout_s
            self._deadline: asyncio.TimerHandle | None = None
            self._dropping: asyncio.TimerHandle | None = None  # answered and closing: what arrives is dropped
            self._accepted = False
            self._head_bytes = 0  # of the request whose headers are still arriving

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= cap:
                WARNINGS.warn("too_many_connections", f"Refusing connections: {cap} are open (max_connections).")
                self._drop(transport, busy_response)
                return
            self._accepted = True
            super().connection_made(transport)
            self._arm()

        def _drop(self, transport: Any, response: bytes) -> None:
            """Answer and close, with no request being answered. The socket still reads (and drops) what
            the client sends for a moment: closing it with unread data would reset it, and the answer
            could be lost on the way."""
            transport.write(response)
            if transport.can_write_eof():
                transport.write_eof()
            self._dropping = self.loop.call_later(REFUSED_LINGER_S, transport.close)

        def data_received(self, data: bytes) -> None:
            if self._dropping is not None:
                return
            if self._deadline is None:  # a new request begins
                self._arm()
            in_head = self._in_head()
            super().data_received(data)
            if not (in_head and self._in_head()):  # (bytes that completed the headers are not counted)
                self._head_bytes = 0
                return
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                WARNINGS.warn("headers_too_large", f"Refusing requests with more than {MAX_HEAD_BYTES} bytes of "
                                                   "headers.")
                self._disarm()
                self._drop(self.transport, head_response)

        def _in_head(self) -> bool:
            """Whether the bytes now arriving are a request line or headers (no request, or the last one
            answered with its body all in)."""
            cycle = self.cycle
            return cycle is None or (cycle.response_complete and not cycle.more_body)

        def eof_received(self) -> Any:
            if self._dropping is not None:
                return None  # (the transport closes itself)
            return super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._dropping is not None:
                self._dropping.cancel()
            if self._accepted:
                super().connection_lost(exc)

        def on_response_complete(self) -> None:
            self._disarm()
            super().on_response_complete()

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(limits.request_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self) -> None:
            self._deadline = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                return  # the whole request is in: the answer may take its time
            if self.transport.is_closing():
                return
            WARNINGS.warn("request_timeout", "Closing connections that did not send a whole request within "
                                             f"{limits.request_timeout_s:g} s (slow or idle clients).")
            if self._in_head() or not cycle.response_started:  # (not after a 413 whose body is still arriving)
                self.transport.write(timeout_response)
            self.transport.close()

    return GuardedProtocol


def connection_cap(max_connections: int) -> int:
    """`max_connections`, lowered to what the file-descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, int(soft * FD_RESERVE_FRACTION)))


def uvicorn_config(app: Any, limits: ServerLimits, **options: Any) -> Any:
    """A uvicorn.Config whose connections follow `limits` (and which logs no access lines)."""
    import uvicorn

    rate_limit_uvicorn_warnings()
    return uvicorn.Config(app, http=guarded_protocol(limits), access_log=False, lifespan="off",
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES, **options)


class _OncePerInterval(logging.Filter):
    """uvicorn logs a warning per bad request ("Invalid HTTP request received.") and a traceback per
    failing connection: each distinct message at most once per interval, counted in between."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        return WARNINGS.permits(f"uvicorn:{record.levelno}:{record.msg}")


_FILTER = _OncePerInterval()


def rate_limit_uvicorn_warnings() -> None:
    logger = logging.getLogger("uvicorn.error")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


@contextlib.contextmanager
def accept_errors_rate_limited():
    """Out of file descriptors, asyncio's accept loop logs a traceback every time it retries: here one
    warning per interval instead (other loop errors go where they went before)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            WARNINGS.warn("accept_failed", "Cannot accept connections: the process is out of file descriptors "
                                           "(or memory); new connections wait until some close.",
                          error=str(context.get("exception")))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


def guarded_server_class() -> type:
    """uvicorn.Server, with the accept loop's errors rate-limited while it serves."""
    import uvicorn

    class GuardedServer(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            with accept_errors_rate_limited():
                await super().serve(sockets)

    return GuardedServer
