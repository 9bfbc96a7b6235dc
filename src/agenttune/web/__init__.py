"""What every agenttune HTTP server does against careless and hostile clients.

The gateway (in training and in `agenttune serve`) and the log viewer run uvicorn; this package
gives them the same defences, each with a documented default (SECURITY.md, docs/gateway.md):

- `limits.ServerLimits`: request-body size, request-read timeout, keep-alive timeout, connection cap;
- `connections`: uvicorn's protocol and server with those timeouts and that cap enforced per
  connection, and warnings that are rate-limited (one per condition per interval, no tracebacks);
- `requests`: the body read with its limit while it streams in, the JSON content-type check, and
  the Host/Origin check that keeps web pages from driving a loopback server (DNS rebinding, CSRF);
- `binding`: whether a host a server binds to is reachable only from this machine.

And, for talking to other servers and in the OpenAI protocol: `http_retry` (retries with backoff for
judges and environment services) and `ids` (ids for completions and tool calls).
"""

from agenttune.web.limits import ServerLimits

__all__ = ["ServerLimits"]
