"""Many episodes at once through one gateway: no cross-talk, every timeline exact."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
EPISODES = 128


def responder(tokenizer):
    """Answers from the prompt: episode N calls lookup(N) twice, then says it is done."""

    def reply(prompt_ids, sampling):
        text = tokenizer.decode(prompt_ids)
        number = re.search(r"episode (\d+)", text).group(1)
        if text.count("<tool_response>") >= 2:
            return f"Done with {number}."
        return f'<tool_call>\n{{"name": "lookup", "arguments": {{"n": {number}}}}}\n</tool_call>'

    return reply


async def run_episode(gateway, index: int, *, http: httpx.AsyncClient | None):
    channel = gateway.open_episode(f"e{index}")
    if http is not None:  # over the loopback socket (one shared connection pool, as a real agent host would)
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0,
                                    http_client=http)
    else:
        client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                    http_client=httpx.AsyncClient(transport=channel.async_transport()))
    messages = [{"role": "user", "content": f"This is episode {index}."}]
    for _ in range(3):
        response = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result = json.loads(call.function.arguments)["n"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"result {result}"})
    if http is None:
        await client.close()
    return channel, messages


@pytest.mark.slow
async def test_many_concurrent_episodes_keep_exact_separate_timelines():
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine(responder=responder(tokenizer), tokenizer=tokenizer)
    async with running_gateway(engine) as gateway, httpx.AsyncClient() as http:
        results = await asyncio.gather(*[run_episode(gateway, index, http=http if index % 4 == 0 else None)
                                         for index in range(EPISODES)])
        for channel, _ in results:
            gateway.close_episode(channel)
    assert len(engine.prompts) == 3 * EPISODES
    for index, (channel, messages) in enumerate(results):
        assert messages[-1]["content"] == f"Done with {index}."
        assert [m["content"] for m in messages if m["role"] == "tool"] == [f"result {index}"] * 2
        [sample] = channel.samples()
        assert sample.num_calls == 3 and channel.metrics()["merge_breaks"] == 0
        rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
        assert tokenizer.decode(sample.prompt_ids + sample.response_ids) + "\n" == rendered
