"""Issue 24: an engine's output is checked where the gateway receives it; a logprob is never invented.

A generation needs one finite logprob (<= 0) per generated token. Otherwise the call fails with a
502 naming the problem, counted by cause, unless the engine declares `returns_logprobs = False`:
then its samples say `engine_logprobs: false` and the local trainer uses its own logprobs instead.
"""

from __future__ import annotations

import math

import httpx
import pytest

from agenttune.components.engines.base import Generation
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway

USER = [{"role": "user", "content": "Hi"}]


async def one_call(engine):
    async with running_gateway(engine, tokenizer=engine.tokenizer, http=False) as gateway:
        channel = gateway.open_episode("e1")
        async with httpx.AsyncClient(transport=channel.async_transport(), base_url="http://g") as client:
            reply = await client.post("/v1/chat/completions", json={"messages": USER},
                                      headers={"Authorization": f"Bearer {channel.key}"})
    return reply, channel


def reply_ids(tokenizer) -> list[int]:
    return tokenizer.encode("Hello.", add_special_tokens=False) + [tokenizer.eos_token_id]


@pytest.mark.parametrize(("logprobs", "cause", "words"), [
    (None, "no_logprobs", "with no logprobs"),
    ("nan", "non_finite_logprob", "a logprob of nan at position 2"),
    ("short", "logprob_count", "tokens with {n_minus_1} logprobs"),
    ("positive", "positive_logprob", "(> 0)"),
])
async def test_a_generation_without_one_finite_logprob_per_token_fails_the_call(logprobs, cause, words):
    tokenizer = tiny_tokenizer()
    ids = reply_ids(tokenizer)
    values = {None: None, "nan": [-0.5, -0.5, math.nan] + [-0.5] * (len(ids) - 3), "short": [-0.5] * (len(ids) - 1),
              "positive": [-0.5] * (len(ids) - 1) + [0.7]}[logprobs]
    reply, channel = await one_call(ScriptedEngine([Generation(ids, values, "stop")], tokenizer=tokenizer))
    assert reply.status_code == 502
    error = reply.json()["error"]
    words = words.format(n_minus_1=len(ids) - 1)
    assert error["code"] == "engine_error" and words in error["message"] and "returns_logprobs" in error["message"]
    metrics = channel.metrics()
    assert metrics[f"engine_output_rejected/{cause}"] == 1 and metrics["engine_errors"] == 1
    assert channel.samples() == []  # nothing was recorded to train on


class NoLogprobsEngine(ScriptedEngine):
    returns_logprobs = False


async def test_an_engine_that_declares_no_logprobs_gives_samples_that_say_so():
    tokenizer = tiny_tokenizer()
    ids = reply_ids(tokenizer)
    reply, channel = await one_call(NoLogprobsEngine([Generation(ids, None, "stop")], tokenizer=tokenizer))
    assert reply.status_code == 200
    [sample] = channel.samples()
    assert sample.engine_logprobs is False and sample.response_ids == ids
