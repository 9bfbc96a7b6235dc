"""Checks on a request before an app reads it: the body's size, its content type, its Host and Origin."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from agenttune.web.binding import is_loopback
from agenttune.web.limits import MIB, error_body

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"The request body is larger than {limit / MIB:g} MiB (the server's max_body_mib); "
                         "send less (a conversation longer than the model's context is refused anyway).")


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(scope: dict[str, Any], receive: Any, limit: int) -> bytes | None:
    """The request body, refused (`BodyTooLarge`) as soon as it is known to exceed `limit` bytes: from
    its Content-Length before any of it is read, else while it streams in. None: the client left."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def is_json(scope: dict[str, Any]) -> bool:
    """Whether the request says its body is JSON (`application/json`, or `application/...+json`).

    Browsers send cross-site form posts and `text/plain` bodies without asking the server first (a
    "simple request"); a JSON content type they may only send after a CORS preflight, which these
    servers never grant. So requiring it keeps other web sites from driving the server."""
    value = header(scope, b"content-type") or ""
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def send_error(send: Any, status: int, message: str, *, code: str, type: str = "invalid_request_error") -> None:
    body = error_body(message, code=code, type=type)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# -- Host and Origin ------------------------------------------------------------------------------------

def allowed_hosts(host: str, named: Iterable[str] = ()) -> frozenset[str] | None:
    """The Host names a server listening on `host` answers to: the loopback names, its own address and
    the names the user gave (`named`). None (any name) when it listens beyond loopback: the user chose
    to expose it, and remote clients reach it under names this process cannot know."""
    if not is_loopback(host):
        return None
    return frozenset(name.lower().strip("[]") for name in (*LOOPBACK_NAMES, host, *named))


def host_name(scope: dict[str, Any]) -> str:
    """The Host header without its port: `127.0.0.1:8181` -> `127.0.0.1`, `[::1]:8181` -> `::1`."""
    host = (header(scope, b"host") or "").lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def origin_name(origin: str) -> str | None:
    """The host name of an Origin header (`http://127.0.0.1:8000` -> `127.0.0.1`); None for `null` or junk."""
    try:
        return urlsplit(origin.strip()).hostname
    except ValueError:
        return None


class HostCheck:
    """ASGI middleware: answers only requests addressed to an allowed host name, and sent by no web page
    of another origin.

    A page the user opens elsewhere can make the browser send requests to a loopback server: through
    DNS rebinding (its own name, resolved to 127.0.0.1: a foreign Host header), or directly (an Origin
    header of another site). Neither reaches the app. Clients that are not browsers send no Origin.
    """

    def __init__(self, app: Any, allowed: Iterable[str]):
        self.app = app
        self.allowed = frozenset(name.lower() for name in allowed)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if host_name(scope) not in self.allowed:
                return await send_error(send, 421, "This server answers only requests to its own address (the "
                                                   "Host header names another); start it with --allow-host NAME "
                                                   "to accept that name.", code="misdirected_request")
            origin = header(scope, b"origin")
            if origin is not None and origin_name(origin) not in self.allowed:
                return await send_error(send, 403, f"Requests from web pages of other sites ({origin}) are "
                                                   "refused; start the server with --allow-host NAME to accept "
                                                   "that site.", code="forbidden_origin")
        await self.app(scope, receive, send)
