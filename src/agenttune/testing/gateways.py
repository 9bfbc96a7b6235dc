"""A running gateway for tests: the tiny tokenizer, a scripted (or any) engine, a loopback server.

    async with running_gateway(ScriptedEngine(["hi"], tokenizer=tiny_tokenizer())) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key())
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agenttune.config import AgentTuneConfig, ModelConfig
from agenttune.config_loader import config_model
from agenttune.engines.base import InferenceEngine
from agenttune.gateway import Gateway
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
