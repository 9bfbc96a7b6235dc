"""Guided decoding is its own extra (issue 36 item 5): without xgrammar the `hf` engine still serves
every free-text request, and a guided one gets a clear 400 that names the extra."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import openai
import pytest

from agenttune.registry.resolution import build_engine
from agenttune.testing.gateways import running_gateway, tiny_config

ROOT = Path(__file__).resolve().parents[3]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
MESSAGES = [{"role": "user", "content": "Find cats."}]


def test_the_local_extra_does_not_bring_xgrammar():
    """triton comes only through xgrammar; the CPU quickstart installs `local`, not `guided`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [requirement for requirement in extras["local"] if requirement.startswith(("xgrammar", "triton"))]
    assert [requirement.split(">")[0] for requirement in extras["guided"]] == ["xgrammar"]


async def test_without_xgrammar_a_guided_request_is_a_clear_400_and_free_text_still_works(
        tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError, as if absent
    config = tiny_config(rollout={"max_response_length_in_one_turn": 8})
    engine = build_engine(config, tiny_tokenizer, model=tiny_model)
    async with running_gateway(engine, config=config) as gateway:
        channel = gateway.open_episode("e")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        for guide in ({"tools": TOOLS, "tool_choice": "required"}, {"response_format": {"type": "json_object"}}):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="m", messages=MESSAGES, **guide)
            message = refused.value.body["message"]
            assert "xgrammar is not installed" in message and "pip install 'agenttune[guided]'" in message
            # streamed: the stream's error event carries the same paragraph (the headers went out first)
            with pytest.raises(openai.APIError, match="agenttune\\[guided\\]"):
                stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True, **guide)
                async for _ in stream:
                    pass
        reply = await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert channel.metrics()["engine_errors"] == 0  # the request was refused, the engine did not fail
    await engine.aclose()
