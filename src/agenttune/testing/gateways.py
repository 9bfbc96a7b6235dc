"""A running gateway for tests: the tiny tokenizer, a scripted (or any) engine, a loopback server.

    async with running_gateway(ScriptedEngine(["hi"], tokenizer=tiny_tokenizer())) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key())
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agenttune.components.engines.base import InferenceEngine
from agenttune.config.models import AgentTuneConfig, ModelConfig
from agenttune.gateway import Gateway
from agenttune.registry.config_loading import config_model
from agenttune.testing import tiny_tokenizer


def tiny_config(**sections: Any) -> AgentTuneConfig:
    """A config for the tiny model; keyword arguments are top-level sections, e.g. rollout={...}
    (plugins' sections included)."""
    model = ModelConfig.model_validate({"path": "tiny://default", **sections.pop("model", {})})
    return config_model()(model=model, **sections)


@asynccontextmanager
async def running_gateway(engine: InferenceEngine, *, tokenizer: Any = None, config: AgentTuneConfig | None = None,
                          http: bool = True) -> AsyncIterator[Gateway]:
    """A gateway on this event loop; `http=False` skips the loopback server (in-process transports only)."""
    gateway = Gateway(engine, tokenizer if tokenizer is not None else tiny_tokenizer(), config or tiny_config())
    if http:
        await gateway.start()
    else:
        gateway.loop = asyncio.get_running_loop()
    try:
        yield gateway
    finally:
        await gateway.stop()


def serve_process(*arguments: str, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """`agenttune serve ARGUMENTS --port 0` in a process of its own, and its base URL once it printed it.
    A server that exits or stays silent is a RuntimeError with what it printed."""
    process = subprocess.Popen([sys.executable, "-m", "agenttune", "serve", "--port", "0", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        match = re.search(r"OpenAI base URL: (http://127\.0\.0\.1:\d+/v1)", line)
        if match:
            return process, match.group(1)
        if not line and process.poll() is not None:
            raise RuntimeError("agenttune serve exited:\n" + "".join(lines))
    process.kill()
    raise RuntimeError("agenttune serve did not print its URL:\n" + "".join(lines))
