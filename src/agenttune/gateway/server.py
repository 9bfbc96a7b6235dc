"""The gateway: an OpenAI-compatible server in front of the inference engine.

    gateway = Gateway(engine, tokenizer, config)
    await gateway.start()                         # uvicorn on 127.0.0.1, a free port
    channel = gateway.open_episode("ep-1", sampling)
    ...                                           # clients send channel.api_key() to channel.base_url
    gateway.close_episode(channel)
    await gateway.stop()

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (token ids or text; `echo` and
`prompt_logprobs` score a prompt: text_completions.py), `GET /v1/models`, `GET /health`; each also under `/e/{key}`
for clients that cannot set an API key. Every answer is JSON (or SSE); refusals use OpenAI's
error shape. The HTTP server and the in-process transports call the same `handle`; the HTTP server
first applies `agenttune.web`'s limits (body size, content type, timeouts, connection cap and,
for `agenttune serve`, the Host/Origin check).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
from typing import Any

import structlog

from agenttune.components.engines.base import InferenceEngine, SamplingParams
from agenttune.config.models import AgentTuneConfig
from agenttune.errors import UserError
from agenttune.gateway.api_errors import GatewayError, bad_request
from agenttune.gateway.channel import AGENT_NAME, AGENT_NAME_RULE, DEFAULT_AGENT, EpisodeChannel
from agenttune.gateway.completions import ChatCompletions
from agenttune.gateway.parser_choice import reasoning_parser, tool_parser
from agenttune.gateway.policy_routing import PolicyRouter
from agenttune.gateway.protocol import parse_chat_request
from agenttune.gateway.rendering import ChatRenderer
from agenttune.gateway.reply import EVENTS, Reply
from agenttune.gateway.responses import completion_body, completion_events, dumps
from agenttune.gateway.text_completions import TextCompletions
from agenttune.web import ServerLimits
from agenttune.web.binding import is_loopback
from agenttune.web.connections import guarded_server_class, uvicorn_config
from agenttune.web.limits import MIB
from agenttune.web.requests import (
    BodyTooLarge,
    HostCheck,
    allowed_hosts,
    is_json,
    read_body,
    send_error,
)

log = structlog.get_logger("agenttune.gateway")

_NAME = re.compile(r"[A-Za-z0-9_.:@+=-]{1,40}")  # an API key that reads like a conversation's name
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")  # an escaped or a raw UTF-16 surrogate


class Gateway:
    def __init__(self, engine: InferenceEngine, tokenizer: Any, config: AgentTuneConfig, *, open_access: bool = False):
        """`open_access`: any API key is accepted, each distinct one a conversation of its own (opened on
        first use, never closed; `agenttune serve`). Otherwise only keys of open episodes are."""
        self.open_access = open_access
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.renderer = ChatRenderer(tokenizer)
        self.router = PolicyRouter(config.policies, engine, by_model=open_access)  # serve: `model: writer`
        self.completions = ChatCompletions(
            engine, self.renderer, tool_parser(config), reasoning_parser(config),
            max_model_len=config.model.max_model_len, madness_checks=list(config.rollout.compute_madness_checklist),
            max_turns=None if open_access else config.rollout.max_turns,  # a served conversation is no episode
            router=self.router)
        self.model_name = config.model.path or "agenttune"
        self.text_completions = TextCompletions(engine, tokenizer, max_model_len=config.model.max_model_len,
                                                model_name=self.model_name)
        self.limits = server_limits(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None
        self._channels: dict[str, EpisodeChannel] = {}
        self._server: Any = None
        self._serving: asyncio.Task | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> Gateway:
        """Serve HTTP on `gateway.host:gateway.port` (port 0: a free one) from this event loop."""
        self.loop = asyncio.get_running_loop()
        if self._server is not None:
            return self
        settings = self.config.gateway
        app = build_app(self)
        hosts = allowed_hosts(settings.host, settings.allowed_hosts) if self.open_access else None
        if hosts is not None:  # agenttune serve answers any key: web pages must not reach it
            app = HostCheck(app, hosts)
        self._server = _embedded_server(uvicorn_config(app, self.limits, host=settings.host, port=settings.port,
                                                       log_level="warning"))
        self._serving = asyncio.create_task(_serve(self._server), name="agenttune-gateway")
        while not self._server.started:
            if self._serving.done():
                error = self._serving.exception() if not self._serving.cancelled() else None
                self._server = None
                raise UserError(f"The gateway could not listen on {settings.host}:{settings.port}: "
                                f"{error or 'the server stopped'}.",
                                hint="Pick another gateway.port (0 picks a free one) or gateway.host.")
            await asyncio.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        if not is_loopback(settings.host):
            log.warning(exposure_warning(settings.host, self.port, any_key=self.open_access))
        return self

    async def stop(self) -> None:
        if self._server is None or self._serving is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self._serving, timeout=5)
        if not self._serving.done():
            self._server.force_exit = True
            self._serving.cancel()
        self._server = self._serving = None
        self.port = None

    async def __aenter__(self) -> Gateway:
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    @property
    def root_url(self) -> str:
        if self.port is None:
            raise RuntimeError("The gateway has no HTTP address until `await gateway.start()`.")
        host = self.config.gateway.host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # -- episodes ------------------------------------------------------------------------------------
    def open_episode(self, episode_id: str, sampling: SamplingParams | None = None) -> EpisodeChannel:
        if self.loop is None:
            with contextlib.suppress(RuntimeError):
                self.loop = asyncio.get_running_loop()
        key = secrets.token_urlsafe(24)
        channel = EpisodeChannel(self, episode_id, key, sampling or self.default_sampling())
        self._channels[key] = channel
        return channel

    def close_episode(self, channel: EpisodeChannel) -> None:
        """Later requests with the channel's key get 401; its record stays readable."""
        channel.closed = True
        self._channels.pop(channel.key, None)

    def default_sampling(self) -> SamplingParams:
        rollout = self.config.rollout
        return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                              max_tokens=rollout.max_response_length_in_one_turn)

    # -- requests ----------------------------------------------------------------------------------------
    async def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply:
        """Answer one HTTP request. Never raises (but for cancellation): refusals are error bodies."""
        try:
            return await self._route(method, path, headers, body)
        except GatewayError as error:
            return Reply(error.status, dumps(error.body()))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug: say so, keep serving
            log.exception("gateway error", path=path)
            return Reply(500, dumps(GatewayError(500, f"Internal gateway error: {type(error).__name__}: {error}",
                                                 type="server_error").body()))

    async def _route(self, method: str, path: str, headers: Any, body: bytes) -> Reply:
        path_key = None
        if path.startswith("/e/"):
            path_key, _, rest = path[3:].partition("/")
            path = "/" + rest
        route = path.rstrip("/").removeprefix("/v1")
        if route == "/chat/completions":
            _allow(method, "POST")
            channel, agent = self._channel(path_key or _header_key(headers))
            request = parse_chat_request(_json(body, self.limits.max_body_bytes))
            if request.stream and self.completions.streams:
                return Reply(200, b"", EVENTS, stream=await self.completions.stream(channel, agent, request))
            result = await self.completions.answer(channel, agent, request)
            if request.stream:
                return Reply(200, completion_events(result), EVENTS)
            return Reply(200, completion_body(result))
        if route == "/completions":
            _allow(method, "POST")
            self._channel(path_key or _header_key(headers))  # the same keys as chat (any, for agenttune serve)
            return Reply(200, dumps(await self.text_completions.answer(_json(body, self.limits.max_body_bytes))))
        if route == "/models":
            _allow(method, "GET")
            names = [self.model_name, *self.router.served_models()]
            return Reply(200, dumps({"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "agenttune"} for name in names]}))
        if route in ("/health", ""):
            _allow(method, "GET")
            return Reply(200, dumps({"status": "ok", "episodes": len(self._channels)}))
        raise GatewayError(404, f"No route {method} {path}. The gateway serves POST /v1/chat/completions, "
                                "POST /v1/completions, GET /v1/models and GET /health.", code="not_found")

    def channels(self) -> list[EpisodeChannel]:
        """The open episodes (in open access: every conversation so far), oldest first."""
        return list(self._channels.values())

    def _channel(self, api_key: str | None) -> tuple[EpisodeChannel, str]:
        key, _, agent = (api_key or "").partition(".")
        channel = self._channels.get(key)
        if channel is None and self.open_access:
            key = key or "default"
            channel = self._channels.get(key) or EpisodeChannel(self, conversation_name(key), key,
                                                                self.default_sampling())
            self._channels[key] = channel
        if channel is None:
            raise GatewayError(401, "Unknown or closed episode key. Send the key the episode was given "
                                    "(tuner.api_key) as the API key, or use the URL /e/{key}/v1.",
                               code="invalid_api_key")
        if agent and not AGENT_NAME.fullmatch(agent):
            raise GatewayError(400, f"The agent name after the '.' in the API key ({agent[:80]!r}) must be "
                                    f"{AGENT_NAME_RULE} (KEY.agent files the calls under that agent).",
                               code="invalid_agent_name")
        return channel, agent or DEFAULT_AGENT


def conversation_name(key: str) -> str:
    """The episode id of an open-access conversation: its key when that reads like a name; a digest when
    the key may be a secret (a provider key left in the agent's environment must not reach the log)."""
    if _NAME.fullmatch(key) and not key.lower().startswith(("sk-", "sk_")):
        return key
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def exposure_warning(host: str, port: int, *, any_key: bool = False) -> str:
    protection = ("every API key is accepted (agenttune serve), so nothing protects it" if any_key else
                  "the episode keys (sent in clear text over HTTP) are the only protection")
    return (f"WARNING: the gateway listens on {host}:{port}, not on loopback: anyone who can reach this machine "
            f"can talk to the model under training, and {protection}. Keep gateway.host: 127.0.0.1 unless "
            "agents on other machines must reach it, and then only on a trusted network.")


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise GatewayError(405, f"Method {method} is not allowed here; use {allowed}.", code="method_not_allowed")


def _header_key(headers: Any) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else authorization.strip()
    return headers.get("api-key") or headers.get("x-api-key")


def server_limits(config: AgentTuneConfig) -> ServerLimits:
    settings = config.gateway
    return ServerLimits(max_body_bytes=int(settings.max_body_mib * MIB), request_timeout_s=settings.request_timeout_s,
                        keep_alive_timeout_s=settings.keep_alive_timeout_s, max_connections=settings.max_connections)


def _json(body: bytes, limit: int) -> Any:
    if len(body) > limit:  # (the HTTP server refuses it before reading it; in-process clients get here)
        raise GatewayError(413, str(BodyTooLarge(limit)), code="request_too_large")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"The request body is not valid JSON: {error}.") from None
    except RecursionError:
        raise bad_request("The request body nests JSON arrays or objects too deeply.") from None
    # A lone UTF-16 surrogate (an unpaired \ud800-\udfff escape, or its raw bytes) is not text: the
    # tokenizer and the UTF-8 reply would fail on it. The full check runs only when one may be present
    # (and the pattern only when an escape or the surrogates' lead byte is there: `in` is much faster).
    if (b"\\u" in body or b"\xed" in body) and _MAYBE_SURROGATE.search(body) and not _is_text(data):
        raise bad_request("The request holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                          "which is not valid Unicode text.")
    return data


def _is_text(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def build_app(gateway: Gateway) -> Any:
    """The ASGI app: every HTTP request goes to `gateway.handle` (Starlette's request and response,
    without a router or middleware: the gateway routes itself, and never lets an error escape).
    A body is read only up to the size limit, and only when it says it is JSON."""
    from starlette.datastructures import Headers
    from starlette.responses import Response, StreamingResponse

    limit = gateway.limits.max_body_bytes

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan and websockets: nothing to do
            return
        method = scope["method"]
        if method == "POST" and not is_json(scope):
            return await send_error(send, 415, "Send the request body as JSON, with the header Content-Type: "
                                               "application/json.", code="unsupported_media_type")
        try:
            body = await read_body(scope, receive, limit) if method in ("POST", "PUT", "PATCH") else b""
        except BodyTooLarge as error:
            return await send_error(send, 413, str(error), code="request_too_large")
        if body is None:  # the client left
            return
        reply = await gateway.handle(method, scope["path"], Headers(scope=scope), body)
        if reply.stream is not None:  # (a client that disconnects closes the stream: the engine drops the row)
            response: Response = StreamingResponse(reply.stream, status_code=reply.status,
                                                   media_type=reply.content_type)
        else:
            response = Response(reply.body, status_code=reply.status, media_type=reply.content_type)
        await response(scope, receive, send)

    return app


async def _serve(server: Any) -> None:
    """uvicorn exits the process (SystemExit) when it cannot bind: here that is an error `start` reports."""
    try:
        await server.serve()
    except SystemExit:
        raise OSError("the address is in use or cannot be bound (uvicorn could not start)") from None


def _embedded_server(config: Any) -> Any:
    """A uvicorn server without its signal handlers: Ctrl-C belongs to the program that embeds the gateway."""
    class EmbeddedServer(guarded_server_class()):  # type: ignore[misc]
        @contextlib.contextmanager
        def capture_signals(self):
            yield

        def install_signal_handlers(self) -> None:
            pass

    return EmbeddedServer(config)
