"""`agenttune serve` under attack while ordinary clients keep chatting (issue 35). Loopback only.

Starts `agenttune serve --model tiny://default` on 127.0.0.1 (its default limits), lets a few
clients chat for `--quiet` seconds (10; /health's latency then is the loaded machine's own noise),
then for `--seconds` (45; the whole run is bounded by these, the server's start and a few seconds
of grace) runs side by side:

    ordinary    the clients chatting on, over their keep-alive connections (as agents with an SDK do)
    health      GET /health every 20 ms over a keep-alive connection, from a process of its own
    huge        a 50 MB body every few seconds, announced (Content-Length) and streamed (chunked):
                the seconds until its 413 arrives
    slowloris   connections sending their request one byte a second
    idle        thousands of sockets that connect and send nothing (beyond the connection cap: 503)
    junk        wrong content types (415), malformed JSON (400), a foreign Origin (403)

and samples the server's RSS. Targets: a 50 MB body refused in < 1 s; /health p99 < 100 ms;
ordinary clients >= 99 % successful; RSS growth < 300 MB; every idle or slow connection closed
within its timeout (request_timeout_s, 30 s by default, + 2 s of slack); 0 tracebacks logged.

    python bench/hostile_load.py --json hostile.json
    python bench/hostile_load.py --seconds 60 --idle 5000 --server-fd-limit 1024   # fd exhaustion too
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"  # loopback only: this script sends attacks, never to another machine
HUGE_BYTES = 50_000_000
SLACK_S = 2.0
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
TURNS = 8  # calls per conversation of an ordinary client


@dataclass
class Tally:
    ordinary_ok: int = 0
    ordinary_failed: int = 0
    ordinary_errors: list[str] = field(default_factory=list)
    ordinary_ok_quiet: int = 0
    ordinary_failed_quiet: int = 0
    quiet_health_ms: list[float] = field(default_factory=list)  # before the attack: the machine's own noise
    health_ms: list[float] = field(default_factory=list)
    huge_reject_s: list[float] = field(default_factory=list)
    huge_refused_by: Counter[str] = field(default_factory=Counter)  # 413, or 503 while idle sockets fill the cap
    huge_unanswered: int = 0
    junk_expected: int = 0
    junk_unexpected: list[str] = field(default_factory=list)
    idle_closed_s: list[float | None] = field(default_factory=list)
    idle_refused_503: int = 0
    unclosed: Counter[str] = field(default_factory=Counter)  # what the connections left open had received
    slow_closed_s: list[float | None] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)


def start_server(run_dir: Path, log_path: Path, fd_limit: int | None) -> tuple[subprocess.Popen, str]:
    def limit_fds() -> None:
        if fd_limit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "agenttune", "serve", "--model", "tiny://default", "--host", HOST, "--port", "0",
         "--run-dir", str(run_dir)], stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_fds,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        match = re.search(r"OpenAI base URL: (http://127\.0\.0\.1:(\d+))/v1", log_path.read_text())
        if match:
            return process, match.group(1)
        if process.poll() is not None:
            raise SystemExit("agenttune serve exited:\n" + log_path.read_text())
        time.sleep(0.2)
    process.kill()
    raise SystemExit("agenttune serve did not start:\n" + log_path.read_text())


async def ordinary(url: str, until: float, tally: Tally, number: int) -> None:
    """An agent: conversations of `TURNS` calls, each sending the history with the model's replies."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for conversation in range(10**6):
            messages = list(CHAT["messages"])
            for _ in range(TURNS):
                if time.monotonic() >= until:
                    return
                try:
                    reply = await client.post("/v1/chat/completions", json={**CHAT, "messages": messages},
                                              headers={"Authorization": f"Bearer ordinary-{number}-{conversation}"})
                    message = reply.json()["choices"][0]["message"] if reply.status_code == 200 else None
                except Exception as error:  # counted: any failure of an ordinary call is what this measures
                    message, reply = None, error
                if message is None:
                    tally.ordinary_failed += 1
                    tally.ordinary_errors.append(str(getattr(reply, "text", reply))[:200])
                    break
                tally.ordinary_ok += 1
                messages += [{"role": "assistant", "content": message["content"] or ""},
                             {"role": "user", "content": "Go on."}]


def probe_health(url: str, seconds: float) -> list[float]:
    """GET /health every 20 ms over one keep-alive connection, in a process of its own (so the latencies
    are the server's, not this script's busy event loop's); milliseconds, failures as infinity."""
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as client:
        client.get("/health")  # connected before the attack starts, as a running client is
        print("ready", flush=True)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                ok = client.get("/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append((time.perf_counter() - started) * 1000 if ok else float("inf"))
            time.sleep(0.02)
    return latencies


async def health(url: str, seconds: float) -> asyncio.Task:
    """The prober started and connected; the task gives its latencies once it is done."""
    process = await asyncio.create_subprocess_exec(sys.executable, __file__, "--probe", url, "--seconds",
                                                   str(seconds), stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    await process.stdout.readline()  # "ready"

    async def latencies() -> list[float]:
        output, _ = await process.communicate()
        return json.loads(output)

    return asyncio.create_task(latencies())


async def huge_body(port: int, tally: Tally, *, chunked: bool) -> None:
    """Send 50 MB (1 MiB at a time) while reading: the seconds until the 413 arrives."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {HUGE_BYTES}"
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                 f"Authorization: Bearer huge\r\n{framing}\r\n\r\n".encode())
    answer = asyncio.create_task(reader.readuntil(b"\r\n\r\n"))
    chunk = b"x" * 2**20
    try:
        for _ in range(HUGE_BYTES // len(chunk)):
            if answer.done():
                break
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
        head = await asyncio.wait_for(answer, timeout=30)
        if head.startswith((b"HTTP/1.1 413", b"HTTP/1.1 503")):
            tally.huge_reject_s.append(time.perf_counter() - started)
            tally.huge_refused_by[head[9:12].decode()] += 1
        else:
            tally.huge_unanswered += 1
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        tally.huge_unanswered += 1
    finally:
        answer.cancel()
        writer.close()


async def huge_bodies(port: int, until: float, tally: Tally) -> None:
    chunked = False
    while time.monotonic() < until - 5:
        await huge_body(port, tally, chunked=chunked)
        chunked = not chunked
        await asyncio.sleep(3)


async def closed_after(port: int, dribble: bytes | None, unclosed: Counter[str]) -> tuple[float | None, bool]:
    """Connect, then send nothing (or `dribble` a byte a second): seconds until the server closed the
    connection (None: never, within the bench), and whether it said 503."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return time.monotonic() - started, False
    answer = b""
    connected = time.monotonic() - started
    try:
        for index in range(10**6):
            if dribble is not None and index < len(dribble):
                writer.write(dribble[index:index + 1])
            try:
                chunk = await asyncio.wait_for(reader.read(65536), timeout=1.0)
            except TimeoutError:
                continue
            answer += chunk
            if not chunk:
                return time.monotonic() - started, answer.startswith(b"HTTP/1.1 503")
    except OSError:
        return (time.monotonic() - started, answer.startswith(b"HTTP/1.1 503"))
    except asyncio.CancelledError:
        unclosed[f"{answer[:12]!r} connected after {connected:.0f} s"] += 1
        raise
    finally:
        writer.close()
    return None, False


async def junk(url: str, until: float, tally: Tally) -> None:
    body = json.dumps(CHAT)
    cases = [({"Content-Type": "text/plain"}, body, 415), ({"Content-Type": "application/x-www-form-urlencoded"},
             body, 415), ({}, body, 415), ({"Content-Type": "application/json"}, "{not json", 400),
             ({"Content-Type": "application/json", "Origin": "http://evil.example"}, body, 403),
             ({"Content-Type": "application/json", "Authorization": "Bearer k.../etc/passwd"}, body, 400),
             ({"Content-Type": "application/json"}, json.dumps({**CHAT, "temperature": 1e9}), 400)]
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while time.monotonic() < until:
            for headers, content, status in cases:
                try:
                    reply = await client.post("/v1/chat/completions", content=content, headers=headers)
                    shaped = set(reply.json()["error"]) == {"message", "type", "param", "code"}
                    good = reply.status_code == status and shaped
                    detail = f"{reply.status_code}: {reply.text[:120]}"
                except Exception as error:
                    good, detail = False, repr(error)
                if good:
                    tally.junk_expected += 1
                else:
                    tally.junk_unexpected.append(detail)
            await asyncio.sleep(0.1)


def rss_mb(pid: int) -> float:
    """The process's resident memory (Linux: /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


async def sample_rss(pid: int, until: float, tally: Tally) -> None:
    while time.monotonic() < until:
        tally.rss_mb.append(rss_mb(pid))
        await asyncio.sleep(0.2)


async def attack(url: str, pid: int, args: argparse.Namespace, tally: Tally) -> float:
    port = int(url.rsplit(":", 1)[1])
    until = time.monotonic() + args.quiet + args.seconds
    chatting = [asyncio.create_task(ordinary(url, until, tally, number)) for number in range(args.clients)]
    tally.quiet_health_ms = await (await health(url, args.quiet))  # ordinary clients only
    baseline = rss_mb(pid)
    tally.ordinary_ok_quiet, tally.ordinary_failed_quiet = tally.ordinary_ok, tally.ordinary_failed
    background = [*chatting, await health(url, args.seconds),
                  asyncio.create_task(sample_rss(pid, until + args.grace, tally))]
    attacks = [asyncio.create_task(huge_bodies(port, until, tally)), asyncio.create_task(junk(url, until, tally))]
    slowloris = b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 10**4
    slow = [asyncio.create_task(closed_after(port, slowloris, tally.unclosed)) for _ in range(args.slow)]
    idle = []
    for _ in range(args.idle):
        idle.append(asyncio.create_task(closed_after(port, None, tally.unclosed)))
        await asyncio.sleep(0)
    await asyncio.gather(*attacks, *background[:-1])
    tally.health_ms = background[-2].result()
    # The idle and slow connections get until their timeout (+ slack) from when they opened.
    done, pending = await asyncio.wait([*idle, *slow], timeout=max(0.0, args.timeout + SLACK_S + args.grace
                                                                     - args.seconds))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for tasks, closed in ((idle, tally.idle_closed_s), (slow, tally.slow_closed_s)):
        for task in tasks:
            result = task.result() if task in done else (None, False)
            closed.append(result[0])
            tally.idle_refused_503 += tasks is idle and result[1]
    background[-1].cancel()
    return baseline


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def closed_fraction(times: list[float | None], limit: float) -> float | None:
    if not times:
        return None
    return sum(1 for seconds in times if seconds is not None and seconds <= limit) / len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the attack lasts")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds of chatting before the attack")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # (the /health prober's own process)
    parser.add_argument("--clients", type=int, default=4, help="ordinary chatting clients")
    parser.add_argument("--idle", type=int, default=2000, help="idle sockets (beyond the cap of 1000: 503)")
    parser.add_argument("--slow", type=int, default=100, help="slowloris connections")
    parser.add_argument("--timeout", type=float, default=30.0, help="the server's request_timeout_s (its default)")
    parser.add_argument("--grace", type=float, default=5.0, help="extra seconds to wait for closes")
    parser.add_argument("--server-fd-limit", type=int, help="run the server with this RLIMIT_NOFILE")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe_health(args.probe, args.seconds)))
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.idle + args.slow + 256)), hard))

    with tempfile.TemporaryDirectory(prefix="hostile-load-") as scratch:
        log_path = Path(scratch) / "server.log"
        process, url = start_server(Path(scratch) / "run", log_path, args.server_fd_limit)
        tally = Tally()
        try:
            started = time.monotonic()
            baseline = asyncio.run(attack(url, process.pid, args, tally))
            elapsed = time.monotonic() - started
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        server_log = log_path.read_text(errors="replace")

    ok = tally.ordinary_ok - tally.ordinary_ok_quiet  # during the attack
    calls = ok + tally.ordinary_failed - tally.ordinary_failed_quiet
    results = {
        "health_p99_ms": percentile(tally.health_ms, 0.99),
        "health_p50_ms": percentile(tally.health_ms, 0.50),
        "health_requests": len(tally.health_ms),
        "health_failed": sum(1 for value in tally.health_ms if value == float("inf")),
        "quiet_health_p99_ms": percentile(tally.quiet_health_ms, 0.99),
        "quiet_health_p50_ms": percentile(tally.quiet_health_ms, 0.50),
        "ordinary_success_rate": ok / calls if calls else None,
        "ordinary_calls": calls,
        "ordinary_errors_sample": tally.ordinary_errors[:3],
        "huge_body_reject_s": max(tally.huge_reject_s) if tally.huge_reject_s else None,
        "huge_body_reject_s_median": statistics.median(tally.huge_reject_s) if tally.huge_reject_s else None,
        "huge_bodies_refused": dict(tally.huge_refused_by),
        "huge_bodies_unanswered": tally.huge_unanswered,
        "server_rss_growth_mb": (max(tally.rss_mb) - baseline) if tally.rss_mb else None,
        "server_rss_baseline_mb": baseline,
        "idle_closed_fraction": closed_fraction(tally.idle_closed_s, args.timeout + SLACK_S),
        "idle_sockets": len(tally.idle_closed_s),
        "idle_refused_503": tally.idle_refused_503,
        "idle_closed_max_s": max((s for s in tally.idle_closed_s if s is not None), default=None),
        "unclosed_connections": dict(tally.unclosed),
        "slow_closed_fraction": closed_fraction(tally.slow_closed_s, args.timeout + SLACK_S),
        "slow_closed_max_s": max((s for s in tally.slow_closed_s if s is not None), default=None),
        "refusals_as_expected": tally.junk_expected,
        "refusals_unexpected": len(tally.junk_unexpected),
        "refusals_unexpected_sample": tally.junk_unexpected[:3],
        "tracebacks_logged": server_log.count("Traceback"),
        "warnings_logged": sum(1 for line in server_log.splitlines() if "warning" in line.lower()),
        "elapsed_s": elapsed,
        "load_average": os.getloadavg(),
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
