"""The gateway under careless and hostile clients (issue 35), on a real loopback server and raw sockets.

Bodies are refused by size before they are buffered, by content type, and by a cheap length bound
before any rendering; connections that are idle, slow (slowloris) or too many are answered and
closed; agent names and sampling values are checked; `agenttune serve`'s open gateway refuses
foreign Host and Origin headers. Timings are not asserted (bench/hostile_load.py measures them);
each test checks what the server answered and that the connection was closed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from structlog.testing import capture_logs

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.gateway import Gateway
from agenttune.gateway.rendering import PieceCache
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config
from agenttune.web.limits import RateLimitedWarnings

TOKENIZER = tiny_tokenizer()
TIMEOUT_S = 0.6  # the request and keep-alive timeouts of these gateways
USER = [{"role": "user", "content": "hi"}]


@contextmanager
def served(*, open_access: bool = True, **gateway: Any) -> Iterator[Gateway]:
    """A gateway on its own event-loop thread (so that the test's blocking sockets do not stall it)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = {"request_timeout_s": TIMEOUT_S, "keep_alive_timeout_s": TIMEOUT_S, "max_body_mib": 1, **gateway}
    config = tiny_config(model={"max_model_len": 4096}, gateway=settings,
                         rollout={"max_response_length_in_one_turn": 8})
    engine = ScriptedEngine(["Hello."], tokenizer=TOKENIZER, cycle=True)
    instance = Gateway(engine, TOKENIZER, config, open_access=open_access)
    asyncio.run_coroutine_threadsafe(instance.start(), loop).result(timeout=30)
    try:
        yield instance
    finally:
        asyncio.run_coroutine_threadsafe(instance.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with served() as instance:
        yield instance


def connect(gateway: Gateway) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=10)


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One whole answer (head and Content-Length body), whether or not the connection stays open."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def error_of(answer: bytes) -> tuple[int, dict[str, Any]]:
    """The status and the OpenAI-style error of a raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return status, error


def post(gateway: Gateway, body: Any, *, key: str = "k", **headers: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}", **headers})


# -- bodies -------------------------------------------------------------------------------------------------
def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(gateway):
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 52428800\r\n\r\n")  # 50 MB announced, none of it sent
        status, error = error_of(read_response(sock))
    assert (status, error["code"]) == (413, "request_too_large")
    assert "1 MiB" in error["message"]


def test_a_streamed_body_is_refused_once_it_passes_the_limit(gateway):
    """No Content-Length (chunked): the server counts while it reads and answers 413 at the limit."""
    chunk = b"x" * 65536
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        sent = 0
        sock.setblocking(False)
        answer = b""
        while not answer and sent < 8 * 2**20:  # the limit is 1 MiB: the answer comes long before 8
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
                answer = sock.recv(65536)
            except BlockingIOError:
                time.sleep(0.01)
        sock.setblocking(True)
        sock.settimeout(10)
        answer += read_response(sock) if b"\r\n\r\n" not in answer else b""
    assert answer.startswith(b"HTTP/1.1 413")
    assert sent < 4 * 2**20


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_declared_json_is_refused(gateway, content_type):
    headers = {"Authorization": "Bearer k"} | ({"Content-Type": content_type} if content_type else {})
    reply = httpx.post(f"{gateway.base_url}/chat/completions", content=json.dumps({"messages": USER}),
                       headers=headers)
    assert reply.status_code == 415 and reply.json()["error"]["code"] == "unsupported_media_type"
    ok = httpx.post(f"{gateway.base_url}/chat/completions", content=json.dumps({"messages": USER}),
                    headers={"Authorization": "Bearer k", "Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_text_that_cannot_fit_is_refused_before_it_is_rendered(gateway):
    renderer = gateway.renderer
    characters = renderer.max_token_chars * 4096 + 1  # at least 4097 tokens whatever they are
    reply = post(gateway, {"messages": [{"role": "user", "content": "é" * characters}]})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["code"] == "context_length_exceeded"
    assert f"{characters} characters are at least" in error["message"]
    assert gateway.completions._renderer_thread is None  # nothing was rendered, in a thread or not


def test_a_large_prompt_is_rendered_off_the_event_loop():
    with served(max_body_mib=4) as gateway:
        gateway.completions.max_model_len = 10**6
        small = post(gateway, {"messages": USER})
        assert small.status_code == 200 and gateway.completions._renderer_thread is None
        large = post(gateway, {"messages": [{"role": "user", "content": "word " * 30_000}]})
        assert large.status_code == 200, large.text
        assert gateway.completions._renderer_thread is not None
        assert large.json()["usage"]["prompt_tokens"] > 10_000


def test_the_piece_cache_is_bounded_by_bytes():
    cache = PieceCache(lambda text: list(range(len(text))), budget=500_000, largest=20_000)
    for number in range(50):
        assert cache.get(f"{number:05d}" + "x" * 10_000) == list(range(10_005))
    assert 0 < cache.size <= 500_000 and 0 < len(cache._entries) < 50
    cache.get("y" * 30_000)  # over `largest`: answered, not kept
    assert "y" * 30_000 not in cache._entries


# -- agent names and sampling values -----------------------------------------------------------------------------
@pytest.mark.parametrize("agent", ["evil/../x", "/etc/passwd", "a" * 65, "nul\x00", "bidi\u202eevil", "sp ace", "é"])
def test_agent_names_outside_the_documented_charset_are_refused(gateway, agent):
    if "\x00" in agent:  # no HTTP client sends a NUL in a header: the key goes in the URL instead
        reply = httpx.post(f"{gateway.root_url}/e/{quote('k.' + agent, safe='')}/v1/chat/completions",
                           json={"messages": USER})
    else:
        reply = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": USER},
                           headers={"Authorization": f"Bearer k.{agent}".encode()})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "invalid_agent_name"


def test_documented_agent_names_are_accepted(gateway):
    for agent in ("solver", "critic-2", "team:planner@v1.5", "a" * 64):
        assert post(gateway, {"messages": USER}, key=f"names.{agent}").status_code == 200
    agents = {sample.agent for sample in gateway._channels["names"].samples()}
    assert agents == {"solver", "critic-2", "team:planner@v1.5", "a" * 64}


@pytest.mark.parametrize(("field", "value", "code"), [
    ("temperature", float("nan"), "invalid_value"), ("temperature", -1, "decimal_below_min_value"),
    ("temperature", 1e9, "decimal_above_max_value"), ("top_p", 7, "decimal_above_max_value"),
    ("top_logprobs", 10**6, "integer_above_max_value"), ("top_logprobs", 2.5, "invalid_type"),
    ("presence_penalty", -3, "decimal_below_min_value"), ("frequency_penalty", float("inf"), "invalid_value"),
    ("top_k", -5, "integer_below_min_value"), ("temperature", "hot", "invalid_type"),
])
def test_sampling_values_out_of_range_are_refused(gateway, field, value, code):
    body = json.dumps({"messages": USER, field: value})  # (NaN and Infinity as Python writes them)
    reply = httpx.post(f"{gateway.base_url}/chat/completions", content=body,
                       headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
    error = reply.json()["error"]
    assert reply.status_code == 400 and (error["code"], error["param"], error["type"]) == (
        code, field, "invalid_request_error")


def test_sampling_values_in_range_are_accepted(gateway):
    body = {"messages": USER, "temperature": 2, "top_p": 0, "top_logprobs": 20, "seed": -1, "top_k": -1}
    assert post(gateway, body).status_code == 200


# -- Host and Origin -------------------------------------------------------------------------------------------
def test_the_open_gateway_refuses_foreign_hosts_and_origins(gateway):
    assert post(gateway, {"messages": USER}, Host="evil.example").status_code == 421
    refused = post(gateway, {"messages": USER}, Origin="http://evil.example")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_origin"
    assert post(gateway, {"messages": USER}, Origin="null").status_code == 403
    assert post(gateway, {"messages": USER}, Host="localhost:1234", Origin="http://127.0.0.1:8000").status_code == 200


def test_named_hosts_are_accepted_and_the_training_gateway_checks_none():
    with served(allowed_hosts=["gpu-box.lan"]) as gateway:
        assert post(gateway, {"messages": USER}, Host="gpu-box.lan:8000").status_code == 200
        assert post(gateway, {"messages": USER}, Host="other.lan").status_code == 421
    with served(open_access=False) as gateway:  # episode keys protect it; agents in containers use other names
        key = gateway.open_episode("e").key
        assert post(gateway, {"messages": USER}, key=key, Host="host.docker.internal").status_code == 200


# -- connections ---------------------------------------------------------------------------------------------
def test_an_idle_connection_is_answered_408_and_closed(gateway):
    with connect(gateway) as sock:
        started = time.monotonic()
        answer = read_until_closed(sock)  # returns once the server closes it
    assert error_of(answer) == (408, error_of(answer)[1]) and error_of(answer)[1]["code"] == "request_timeout"
    assert time.monotonic() - started < 10


def test_a_slowloris_client_is_closed(gateway):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    sent, answer = 0, b""
    with connect(gateway) as sock:
        sock.settimeout(0.05)
        for byte in request:  # a byte every 50 ms (10 s in all): each keeps the connection busy
            try:
                sock.send(bytes([byte]))
                sent += 1
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            answer += chunk
            if not chunk:  # closed by the server
                break
    assert sent < len(request) and answer.startswith(b"HTTP/1.1 408")
    assert httpx.get(f"{gateway.root_url}/health").status_code == 200


def test_an_idle_keep_alive_connection_is_closed(gateway):
    with connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1


def test_a_slow_answer_is_not_cut_by_the_request_timeout(gateway):
    engine = gateway.engine
    engine.delay = TIMEOUT_S * 3
    try:
        reply = post(gateway, {"messages": USER})
    finally:
        engine.delay = 0.0
    assert reply.status_code == 200, reply.text


def test_connections_beyond_the_cap_get_503_and_the_server_keeps_serving():
    with served(max_connections=4, request_timeout_s=30) as gateway:
        idle = [connect(gateway) for _ in range(4)]
        time.sleep(0.2)
        with connect(gateway) as extra:
            status, error = error_of(read_until_closed(extra))
        assert (status, error["code"]) == (503, "too_many_connections")
        for sock in idle:
            sock.close()
        time.sleep(0.2)
        assert httpx.get(f"{gateway.root_url}/health").status_code == 200


def test_warnings_are_rate_limited():
    warnings = RateLimitedWarnings(interval_s=0.2)
    with capture_logs() as logs:
        for _ in range(100):
            warnings.warn("flood", "many connections")
        time.sleep(0.25)
        warnings.warn("flood", "many connections")
        warnings.warn("other", "something else")
    assert [entry["event"] for entry in logs] == ["many connections"] * 2 + ["something else"]
    assert logs[1]["more_since_last_warning"] == 99


def test_a_workflow_asking_for_a_bad_agent_name_is_told_at_once(gateway):
    channel = gateway.open_episode("named")
    assert channel.api_key("critic-2").endswith(".critic-2")
    with pytest.raises(ValueError, match="not 1-64 letters"):
        channel.api_key("my critic")


def test_endless_headers_are_refused_431(gateway):
    """httptools gathers a header by concatenating its pieces: 16 MiB of one header would cost the event
    loop quadratic time. The server answers 431 after 64 KiB and drops the rest."""
    with connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        try:
            for _ in range(256):
                sock.sendall(b"a" * 65536)
        except ConnectionError:
            pass
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431")
    assert error_of(answer)[1]["code"] == "request_header_fields_too_large"
    assert httpx.get(f"{gateway.root_url}/health").status_code == 200


def test_the_accept_loop_out_of_descriptors_warns_once_per_interval(monkeypatch):
    """What asyncio's accept loop reports on EMFILE (each retry, a second apart, with a traceback)."""
    from agenttune.web import connections
    from agenttune.web.connections import accept_errors_rate_limited

    monkeypatch.setattr(connections, "WARNINGS", RateLimitedWarnings())  # (the process's own may have fired)

    others: list[dict] = []

    async def flood() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: others.append(context))
        with accept_errors_rate_limited():
            for _ in range(50):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files")})
            loop.call_exception_handler({"message": "something else"})
        assert loop.get_exception_handler() is not None  # the previous one is back

    with capture_logs() as logs:
        asyncio.run(flood())
    accept_warnings = [entry for entry in logs if entry.get("condition") == "accept_failed"]
    assert len(accept_warnings) == 1 and "Too many open files" in accept_warnings[0]["error"]
    assert [context["message"] for context in others] == ["something else"]


def test_uvicorns_per_request_warnings_are_rate_limited(monkeypatch):
    import logging

    from agenttune.web import connections
    from agenttune.web.connections import rate_limit_uvicorn_warnings

    monkeypatch.setattr(connections, "WARNINGS", RateLimitedWarnings())

    rate_limit_uvicorn_warnings()
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        for _ in range(200):
            logger.warning("Invalid HTTP request received (test %s).", "flood")
    finally:
        logger.removeHandler(handler)
    assert len(seen) == 1
