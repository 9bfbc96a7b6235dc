"""What the rollout engine adds per episode, and what sync workflows (threads) cost over async ones.

Every variant runs the same 2-call tool conversation per episode through the real gateway with an
engine that answers instantly (scripted), so what is measured is bookkeeping, not generation:

    baseline   the conversations on gateway channels opened by hand (no RolloutEngine, no judge)
    engine     the same conversations as RolloutEngine episodes with an (instant) judge
    sync       a sync workflow (one thread per episode, the sync OpenAI client) through RolloutEngine

    python bench/rollout_overhead.py                    # 256 episodes, 64 at once
    python bench/rollout_overhead.py --episodes 1024 --parallel 128

Target: the engine adds less than 10% (ratio engine/baseline < 1.1); sync workflows stay within 2x.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agenttune import Judge, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.rollout_engine import RolloutEngine, sampling_params
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
REPLIES = ['<tool_call>\n{"name": "lookup", "arguments": {"q": "France"}}\n</tool_call>', "Paris."]


def conversation_messages(query: str) -> list[dict]:
    return [{"role": "user", "content": query}]


async def converse(client, query: str) -> str:
    messages = conversation_messages(query)
    first = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Paris"}]
    return (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message.content


def converse_sync(client, query: str) -> str:
    messages = conversation_messages(query)
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Paris"}]
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message.content


class AsyncAgent(Workflow):
    async def execute(self, task, tuner):
        return WorkflowOutput(metadata={"final_answer": await converse(tuner.as_async_openai_client(), task.query)})


class SyncAgent(Workflow):
    def execute(self, task, tuner):
        return WorkflowOutput(metadata={"final_answer": converse_sync(tuner.as_openai_client(), task.query)})


class InstantJudge(Judge):
    name = "instant"

    async def judge(self, judge_input):
        return JudgeResult(reward=1.0, success=True)


def responder(tokenizer):
    """The tool call for a first turn, the answer after a tool result (any number of episodes at once)."""
    ids = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in REPLIES]
    return lambda prompt_ids, sampling: ids[1] if "<tool_response>" in tokenizer.decode(prompt_ids) else ids[0]


async def baseline(gateway, tasks, parallel: int) -> None:
    import httpx
    import openai

    slots = asyncio.Semaphore(parallel)

    async def one(task):
        async with slots:
            channel = gateway.open_episode(task.task_id, sampling_params(gateway.config.rollout))
            async with openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0,
                                          http_client=httpx.AsyncClient(transport=channel.async_transport())) as client:
                await converse(client, task.query)
            channel.samples(), channel.messages(), channel.metrics()
            gateway.close_episode(channel)

    await asyncio.gather(*(one(task) for task in tasks))


async def main(episodes: int, parallel: int, rounds: int) -> None:
    tokenizer = tiny_tokenizer()
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": parallel})
    tasks = [Task(task_id=f"t{i}", query=f"What is the capital of France? ({i})") for i in range(episodes)]
    engine = ScriptedEngine(tokenizer=tokenizer, responder=responder(tokenizer))
    timings: dict[str, float] = {}
    async with running_gateway(engine, config=config) as gateway:
        await baseline(gateway, tasks[:parallel], parallel)  # warm up
        variants = {
            "baseline": lambda: baseline(gateway, tasks, parallel),
            "engine": lambda: RolloutEngine(config, gateway, AsyncAgent, InstantJudge()).run_tasks(tasks),
            "sync": lambda: RolloutEngine(config, gateway, SyncAgent, InstantJudge()).run_tasks(tasks),
        }
        for _ in range(rounds):  # interleaved rounds, best of each: less at the mercy of other load
            for name, run in variants.items():
                started = time.perf_counter()
                result = await run()
                elapsed = time.perf_counter() - started
                timings[name] = min(timings.get(name, elapsed), elapsed)
                if result is not None:
                    assert all(not episode.status.failed for episode in result), result[0].error
    print(f"{episodes} episodes, 2 calls each, {parallel} at once, best of {rounds} rounds")
    for name, seconds in timings.items():
        print(f"  {name:9s} {episodes / seconds:8.1f} episodes/s  {1000 * seconds / episodes:6.2f} ms/episode  "
              f"ratio to baseline {seconds / timings['baseline']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--parallel", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.episodes, arguments.parallel, arguments.rounds))
