"""The test OpenEnv servers (tests/test_servers/) as real uvicorn processes on loopback.

    def test_x(guess_server, echo_server):       # one of each for the whole session: importing openenv
        guess_server.url, guess_server.stats()     # (it imports gradio) takes seconds, so tests share them

tools_server serves an MCP tool environment (tools_env); solo_server the echo environment on a server
that takes one session at a time (max_concurrent_envs=1): a test must leave its session closed.

Counters in stats() are cumulative (compare before and after); `live` must be back to 0 after a test.
The servers are killed when the session ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

TESTS = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def app_path(name: str) -> str:
    return f"test_servers.{name}_env:app"


def server_command(name: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app_path(name), "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_stats", timeout=5).json()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def wait_healthy(url: str, process: subprocess.Popen[bytes] | None, log: Path | None, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the test OpenEnv server exited: {log.read_text() if log else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the test OpenEnv server did not come up: {log.read_text() if log else ''}")


def launch(name: str, log_dir: Path) -> Server:
    port = free_port()
    log = log_dir / f"openenv-{name}-{port}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(server_command(name, port), cwd=TESTS, stdout=output, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Server(f"http://127.0.0.1:{port}", process, log)


@pytest.fixture(scope="session")
def test_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """The test servers, started at once (each spends seconds importing openenv)."""
    log_dir = tmp_path_factory.mktemp("openenv-servers")
    servers = {name: launch(name, log_dir) for name in ("guess", "echo", "tools", "solo")}
    try:
        for server in servers.values():
            wait_healthy(server.url, server.process, server.log)
        yield servers
    finally:
        for server in servers.values():
            server.kill()


@pytest.fixture
def guess_server(test_servers: dict[str, Server]) -> Server:
    return test_servers["guess"]


@pytest.fixture
def echo_server(test_servers: dict[str, Server]) -> Server:
    return test_servers["echo"]


@pytest.fixture
def tools_server(test_servers: dict[str, Server]) -> Server:
    return test_servers["tools"]


@pytest.fixture
def solo_server(test_servers: dict[str, Server]) -> Server:
    return test_servers["solo"]


@pytest.fixture(autouse=True)
def _no_agenttune_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENTTUNE_"):
            monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(TESTS))
