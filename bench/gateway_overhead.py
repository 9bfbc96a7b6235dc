"""What the gateway adds to an LLM call, over loopback HTTP and over the in-process transport.

The engine answers instantly (a scripted tool call), so what is measured is the gateway itself:
request parsing, chat-template rendering, timeline merging, tool-call parsing, the transport. Every
episode is a 3-call tool conversation (the 2nd and 3rd calls extend the timeline), on a fresh
episode key. Side by side, in one run, at 1, 16, 64 and 256 concurrent episodes:

    direct       the same engine called with ready prompt ids (no gateway): the floor
    in-process   httpx through `channel.async_transport()`, gateway and clients on one event loop
    http         over loopback HTTP to the gateway in its own process (as out-of-process agents), with
                 a minimal keep-alive HTTP/1.1 client (httpx would cost the client more than the server)
    bare-http    reference: the same HTTP stack (uvicorn + Starlette) returning a canned reply

    python bench/gateway_overhead.py                     # the table (about 20 s)
    python bench/gateway_overhead.py --levels 1,64 --scale 2

Targets (2 cores): p50 added latency < 2 ms over HTTP at 1 episode; >= 1000 calls/s at 64 over
HTTP. Client and server share the machine's cores, so calls/s is what this Python client gets; the
`server us/call` column is the gateway process's own CPU per call (its capacity is 1e6 / that, per core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
REPLY = '<tool_call>\n{"name": "lookup", "arguments": {"q": "capital of France"}}\n</tool_call>'
CANNED = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{
    "index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "lookup", "arguments": '{"q": "capital of France"}'}}]}}],
    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
TURNS = 3
KEYS_PER_SERVER = 8000
LEVELS = (1, 16, 64, 256)
LOAD_AT_START = 0.0


def instant_engine():
    """The engine every mode uses: answers every prompt at once with the same tool call."""
    from agenttune.components.engines.scripted import ScriptedEngine
    from agenttune.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    reply_ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    return ScriptedEngine(tokenizer=tokenizer, responder=lambda prompt, sampling: reply_ids)


def gateway_for(engine):
    from agenttune.gateway import Gateway
    from agenttune.testing import tiny_tokenizer
    from agenttune.testing.gateways import tiny_config

    return Gateway(engine, tiny_tokenizer(), tiny_config(model={"max_model_len": 32768}))


# -- servers in their own process ----------------------------------------------------------------------
async def serve_gateway() -> None:
    gateway = gateway_for(instant_engine())
    await gateway.start()
    keys = [gateway.open_episode(f"e{i}").key for i in range(KEYS_PER_SERVER)]
    print(json.dumps({"url": gateway.base_url, "keys": keys}), flush=True)
    await asyncio.Event().wait()


async def serve_bare() -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = json.dumps(CANNED).encode()

    async def completions(request: Request) -> Response:
        json.loads(await request.body())  # read and parse the request, as any server must
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}/v1", "keys": ["none"] * KEYS_PER_SERVER}), flush=True)
    await task


class ServerProcess:
    def __init__(self, kind: str):
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        info = json.loads(self.process.stdout.readline())
        self.url, self.keys = info["url"], iter(info["keys"])

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process (Linux)."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


# -- one episode: a 3-call tool conversation -----------------------------------------------------------
Post = Callable[[dict], Awaitable[dict]]


def first_messages(index: int) -> list[dict]:
    return [{"role": "system", "content": "You answer questions with the lookup tool."},
            {"role": "user", "content": f"What is the capital of France? (episode {index})"}]


async def conversation(post: Post, index: int, latencies: list[float]) -> None:
    messages = first_messages(index)
    for turn in range(TURNS):
        started = time.perf_counter()
        reply = await post({"model": "m", "messages": messages, "tools": TOOLS})
        latencies.append(time.perf_counter() - started)
        message = reply["choices"][0]["message"]
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                               "content": f"Paris (lookup {turn})"}]


@dataclass
class Result:
    latencies: list[float]
    calls_per_s: float
    client_us_per_call: float  # CPU of this process per call (for in-process: clients + gateway)
    server_us_per_call: float | None = None  # CPU of the server process per call (HTTP modes)

    def percentile(self, q: int) -> float:
        return statistics.quantiles(self.latencies, n=100)[q - 1] * 1000


async def drive(episode: Callable[[int, list[float]], Awaitable[None]], concurrency: int,
                episodes: int) -> Result:
    """Run `episodes` episodes, `concurrency` at a time; latency of every call, calls per second."""
    latencies: list[float] = []
    counter = iter(range(episodes))

    async def worker() -> None:
        for index in counter:
            await episode(index, latencies)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return Result(latencies, len(latencies) / elapsed, cpu / len(latencies) * 1e6)


# -- the modes -------------------------------------------------------------------------------------------
async def run_direct(concurrency: int, episodes: int) -> Result:
    from agenttune.components.engines.base import SamplingParams
    from agenttune.gateway.rendering import ChatRenderer
    from agenttune.testing import tiny_tokenizer

    engine, renderer, sampling = instant_engine(), ChatRenderer(tiny_tokenizer()), SamplingParams(max_tokens=512)
    prompts = [renderer.encode(renderer.render(first_messages(0), TOOLS, add_generation_prompt=True))] * TURNS

    async def episode(index: int, latencies: list[float]) -> None:
        for prompt in prompts:
            started = time.perf_counter()
            await engine.generate(prompt, sampling)
            latencies.append(time.perf_counter() - started)

    await drive(episode, concurrency, 20)
    return await drive(episode, concurrency, episodes)


async def run_in_process(concurrency: int, episodes: int) -> Result:
    import httpx

    gateway = gateway_for(instant_engine())
    gateway.loop = asyncio.get_running_loop()  # no HTTP server: the transport calls the handler
    # One client for every episode, as in the HTTP mode: the transport is the gateway's, the key routes.
    async with httpx.AsyncClient(transport=gateway.open_episode("warm").async_transport(),
                                 base_url="http://gateway") as client:
        async def episode(index: int, latencies: list[float]) -> None:
            channel = gateway.open_episode(f"e{index}")
            headers = {"Authorization": f"Bearer {channel.key}"}

            async def post(body: dict) -> dict:
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
                assert response.status_code == 200, response.text
                return response.json()

            await conversation(post, index, latencies)
            gateway.close_episode(channel)

        await drive(episode, concurrency, 20)
        return await drive(episode, concurrency, episodes)


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client connection: the load generator must cost less than the server
    it measures (httpx spends several times the gateway's CPU per call)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)), host)

    async def post(self, path: str, body: bytes, key: str) -> tuple[int, bytes]:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {key}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def run_http(server: ServerProcess, concurrency: int, episodes: int) -> Result:
    path = server.url.split("//", 1)[1].split("/", 1)[1]
    free = [await RawConnection.open(server.url) for _ in range(concurrency)]

    async def episode(index: int, latencies: list[float]) -> None:
        key, connection = next(server.keys), free.pop()

        async def post(body: dict) -> dict:
            status, reply = await connection.post(f"/{path}/chat/completions", json.dumps(body).encode(), key)
            assert status == 200, reply
            return json.loads(reply)

        try:
            await conversation(post, index, latencies)
        finally:
            free.append(connection)

    try:
        await drive(episode, concurrency, 20)
        cpu_before = server.cpu_seconds()
        result = await drive(episode, concurrency, episodes)
        result.server_us_per_call = (server.cpu_seconds() - cpu_before) / len(result.latencies) * 1e6
        return result
    finally:
        for connection in free:
            connection.close()


# -- the table ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["gateway", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="Concurrent episodes, comma-separated.")
    parser.add_argument("--scale", type=float, default=1.0, help="Multiply the episodes run per level.")
    args = parser.parse_args()
    if args.serve:
        return asyncio.run(serve_gateway() if args.serve == "gateway" else serve_bare())
    global LOAD_AT_START
    LOAD_AT_START = os.getloadavg()[0]
    levels = [int(level) for level in args.levels.split(",")]
    episodes = {level: int(max(150, 3 * level) * args.scale) for level in levels}
    results: dict[tuple[str, int], Result] = {}
    for level in levels:
        results["direct", level] = asyncio.run(run_direct(level, episodes[level]))
        results["in-process", level] = asyncio.run(run_in_process(level, episodes[level]))
    for mode, kind in (("http", "gateway"), ("bare-http", "bare")):
        server = ServerProcess(kind)  # a fresh server per mode; keys are never reused
        try:
            for level in levels:
                results[mode, level] = asyncio.run(run_http(server, level, episodes[level]))
        finally:
            server.close()
    print_table(results, levels)


def print_table(results: dict[tuple[str, int], Result], levels: list[int]) -> None:
    print(f"{TURNS}-call tool conversations, one episode key each; instant engine; {os.cpu_count()} cores "
          f"shared by clients and server; load average {os.getloadavg()[0]:.1f} (from {LOAD_AT_START:.1f})")
    print(f"{'mode':11s} {'episodes':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'added p50':>10s} {'added p99':>10s} "
          f"{'calls/s':>9s} {'client us/call':>15s} {'server us/call':>15s}")
    for mode in ("direct", "in-process", "http", "bare-http"):
        for level in levels:
            result, floor = results[mode, level], results["direct", level]
            server = f"{result.server_us_per_call:15.0f}" if result.server_us_per_call else f"{'':15s}"
            print(f"{mode:11s} {level:8d} {result.percentile(50):8.3f} {result.percentile(99):8.3f} "
                  f"{result.percentile(50) - floor.percentile(50):10.3f} "
                  f"{result.percentile(99) - floor.percentile(99):10.3f} {result.calls_per_s:9.0f} "
                  f"{result.client_us_per_call:15.0f} {server}")
    print()
    print("CPU per call does not depend on how busy the machine is; wall-clock columns do. With a core each for")
    print("client and server, HTTP calls/s would be about 1e6 / max(client, server us/call):")
    for level in levels:
        http, bare = results["http", level], results["bare-http", level]
        print(f"  at {level:3d}: gateway {1e6 / max(http.client_us_per_call, http.server_us_per_call):6.0f} calls/s, "
              f"bare HTTP stack {1e6 / max(bare.client_us_per_call, bare.server_us_per_call):6.0f}; "
              f"gateway server CPU {http.server_us_per_call - bare.server_us_per_call:4.0f} us/call above the bare stack")
    print()
    for level in levels:
        http, bare, inproc = results["http", level], results["bare-http", level], results["in-process", level]
        print(f"at {level:3d}: http/bare-http p50 ratio {http.percentile(50) / bare.percentile(50):5.2f}, "
              f"calls/s ratio {http.calls_per_s / bare.calls_per_s:4.2f}; in-process/http calls/s ratio "
              f"{inproc.calls_per_s / http.calls_per_s:4.2f}")
    if 1 in levels:
        added = results["http", 1].percentile(50) - results["direct", 1].percentile(50)
        print(f"target p50 added latency over HTTP < 2 ms at 1 episode: {added:.2f} ms -> "
              f"{'met' if added < 2 else 'NOT met'}")
    if 64 in levels:
        rate = results["http", 64].calls_per_s
        print(f"target >= 1000 calls/s over HTTP at 64 episodes: {rate:.0f} -> {'met' if rate >= 1000 else 'NOT met'}")


if __name__ == "__main__":
    main()
