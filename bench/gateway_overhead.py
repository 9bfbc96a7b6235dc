"""How much the gateway adds to an LLM call: latency over HTTP and throughput at 64 concurrent clients.

The gateway runs in its own process with an engine that answers instantly (a scripted tool call), so
what is measured is the gateway itself: parsing, template rendering, timeline merging, tool-call
parsing, HTTP. The baseline is the same HTTP stack (uvicorn + Starlette) returning a canned
completion without doing anything. Each client runs 3-call tool conversations (the later calls extend
the timeline), one episode per conversation.

    python bench/gateway_overhead.py            # prints p50/p90 latency, calls/s, and the ratios
    python bench/gateway_overhead.py --seconds 10 --concurrency 64

Targets: p50 overhead < 2 ms over HTTP; >= 1000 calls/s at 64 concurrent clients (2 cores).
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

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
REPLY = '<tool_call>\n{"name": "lookup", "arguments": {"q": "capital of France"}}\n</tool_call>'
CANNED = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{
    "index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "lookup", "arguments": '{"q": "capital of France"}'}}]}}],
    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


# -- servers (each in its own process) -------------------------------------------------------------------
async def serve_gateway(keys: int) -> None:
    from agenttune.engines.scripted import ScriptedEngine
    from agenttune.gateway import Gateway
    from agenttune.testing import tiny_tokenizer
    from agenttune.testing.gateways import tiny_config

    tokenizer = tiny_tokenizer()
    reply_ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine = ScriptedEngine(responder=lambda prompt, sampling: reply_ids)
    gateway = Gateway(engine, tokenizer, tiny_config(model={"max_model_len": 32768}))
    await gateway.start()
    channels = [gateway.open_episode(f"e{i}") for i in range(keys)]
    print(json.dumps({"url": gateway.base_url, "keys": [channel.key for channel in channels]}), flush=True)
    await asyncio.Event().wait()


async def serve_baseline() -> None:
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
    print(json.dumps({"url": f"http://127.0.0.1:{port}/v1", "keys": ["none"] * 10000}), flush=True)
    await task


# -- the load generator ---------------------------------------------------------------------------------------
async def conversation(client, url: str, key: str, latencies: list[float]) -> None:
    messages = [{"role": "system", "content": "You answer questions with the lookup tool."},
                {"role": "user", "content": "What is the capital of France? Use the tool, then answer."}]
    headers = {"Authorization": f"Bearer {key}"}
    for turn in range(3):
        started = time.perf_counter()
        response = await client.post(f"{url}/chat/completions", json={"model": "m", "messages": messages,
                                                                        "tools": TOOLS}, headers=headers)
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                               "content": f"Paris (lookup {turn})"}]


async def measure(url: str, keys: list[str], *, concurrency: int,
                  seconds: float) -> tuple[list[float], float, int]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        sequential: list[float] = []
        for index in range(150):  # latency: one client, one call at a time
            await conversation(client, url, keys[index % len(keys)], sequential)
        calls: list[float] = []
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            round_ = 0
            while time.perf_counter() < deadline:
                await conversation(client, url, keys[(index * 997 + round_) % len(keys)], calls)
                round_ += 1

        started = time.perf_counter()
        await asyncio.gather(*[worker(i) for i in range(concurrency)])
        return sequential[30:], len(calls) / (time.perf_counter() - started), len(sequential) + len(calls)


def start_server(kind: str) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return process, json.loads(process.stdout.readline())


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["gateway", "baseline"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if args.serve == "gateway":
        return asyncio.run(serve_gateway(keys=4000))
    if args.serve == "baseline":
        return asyncio.run(serve_baseline())
    results = {}
    for kind in ("baseline", "gateway"):
        process, info = start_server(kind)
        try:
            cpu_before = cpu_seconds(process.pid)
            latencies, rate, calls = asyncio.run(measure(info["url"], info["keys"], concurrency=args.concurrency,
                                                         seconds=args.seconds))
            cpu_per_call = (cpu_seconds(process.pid) - cpu_before) / calls
        finally:
            process.terminate()
            process.wait()
        results[kind] = (percentile(latencies, 50), percentile(latencies, 90), rate, cpu_per_call)
        print(f"{kind:9s} p50 {results[kind][0]:6.2f} ms   p90 {results[kind][1]:6.2f} ms   "
              f"{rate:7.0f} calls/s at {args.concurrency} concurrent   server CPU {cpu_per_call * 1e6:6.0f} us/call "
              f"(= {1 / cpu_per_call:5.0f} calls/s per core)")
    base, gate = results["baseline"], results["gateway"]
    print(f"gateway overhead over the bare HTTP stack: p50 +{gate[0] - base[0]:.2f} ms "
          f"(ratio {gate[0] / base[0]:.2f}x); throughput ratio {gate[2] / base[2]:.2f}x; "
          f"server CPU ratio {gate[3] / base[3]:.2f}x")
    print(f"targets: p50 overhead < 2 ms: {'met' if gate[0] - base[0] < 2 else 'NOT met'}; "
          f">= 1000 calls/s: {'met' if gate[2] >= 1000 else 'NOT met'} measured with this Python client "
          f"({os.cpu_count()} cores shared by client and server); the server alone needs "
          f"{gate[3] * 1e6:.0f} us CPU per call")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
