"""The EnvService test server (agenttune_envservice.demo_server) as a real process on loopback.

    def test_x(env_server):              # a server with default settings
        env_server.url, env_server.stats()

    def test_y(start_env_server):        # a server with fault injection
        server = start_env_server("--fail-every", "3")

Every server a test starts is killed when the test ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "agenttune_envservice.demo_server", "--port", str(port), *args]


@dataclass
class EnvServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_stats", timeout=5).json()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the test EnvService server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the test EnvService server did not come up: {log.read_text()}")


@pytest.fixture
def start_env_server(tmp_path: Path) -> Iterator[Callable[..., EnvServer]]:
    servers: list[EnvServer] = []

    def start(*args: str) -> EnvServer:
        port = free_port()
        log = tmp_path / f"env-server-{port}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(server_command(port, *args), stdout=output, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        server = EnvServer(f"http://127.0.0.1:{port}", process, log)
        servers.append(server)
        wait_healthy(server.url, process, log)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def env_server(start_env_server: Callable[..., EnvServer]) -> EnvServer:
    return start_env_server()


@pytest.fixture(autouse=True)
def _no_agenttune_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENTTUNE_"):
            monkeypatch.delenv(name)
