"""How well the rollout engine overlaps episodes: efficiency = ideal time / measured time.

N episodes of a 4-turn tool-calling workflow (openai client through `tuner`, the in-process
transport, the real gateway and RolloutEngine, an instant judge) against an engine that takes a fixed
50 ms per call and serves any number of calls at once (a remote server with room to spare). With C
episodes at a time the ideal is ceil(N / C) waves x 4 turns x 50 ms; anything above that is the
gateway's and the rollout engine's bookkeeping, or episodes waiting on each other.

    python bench/rollout_concurrency.py                        # C = 1, 16, 64, 128, 256; async and sync workflows
    python bench/rollout_concurrency.py --levels 128 --waves 8

Target: efficiency >= 0.9 at C = 128 (2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time

from agenttune import Judge, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.engines.scripted import ScriptedEngine
from agenttune.rollout import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TURNS = 4
LATENCY_S = 0.050
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"q": "France"}}\n</tool_call>'


def turn_messages(task: Task) -> list[dict]:
    return [{"role": "system", "content": "Look facts up with the tool, then answer."},
            {"role": "user", "content": task.query}]


def tool_result(message, turn: int) -> dict:
    return {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"Paris ({turn})"}


class AsyncAgent(Workflow):
    async def execute(self, task, tuner):
        client, messages = tuner.as_async_openai_client(), turn_messages(task)
        for turn in range(TURNS):
            message = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
            messages += [message.model_dump(exclude_none=True), tool_result(message, turn)]
        return WorkflowOutput(metadata={"turns": TURNS})


class SyncAgent(Workflow):
    def execute(self, task, tuner):
        client, messages = tuner.as_openai_client(), turn_messages(task)
        for turn in range(TURNS):
            message = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
            messages += [message.model_dump(exclude_none=True), tool_result(message, turn)]
        return WorkflowOutput(metadata={"turns": TURNS})


class InstantJudge(Judge):
    name = "instant"

    async def judge(self, judge_input):
        return JudgeResult(reward=1.0, success=True)


async def measure(workflow: type[Workflow], concurrency: int, episodes: int) -> tuple[float, float]:
    """(measured seconds, ideal seconds) for `episodes` episodes, `concurrency` at a time."""
    tokenizer = tiny_tokenizer()
    reply = tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine = ScriptedEngine(tokenizer=tokenizer, responder=lambda prompt, sampling: reply, delay=LATENCY_S)
    config = tiny_config(model={"max_model_len": 8192},
                         rollout={"num_repeat": 1, "max_env_worker": concurrency, "episode_timeout": 600})
    tasks = [Task(task_id=f"t{index}", query=f"What is the capital of France? ({index})") for index in range(episodes)]
    async with running_gateway(engine, config=config) as gateway:  # started as in a run
        rollout = RolloutEngine(config, gateway, workflow, InstantJudge())
        await rollout.run_tasks(tasks[: min(concurrency, 8)])  # warm up (imports, template compilation)
        started = time.perf_counter()
        results = await rollout.run_tasks(tasks)
        elapsed = time.perf_counter() - started
    failed = [episode for episode in results if episode.status.failed or episode.metrics.get("calls") != TURNS]
    assert not failed, f"{len(failed)} episodes failed: {failed[0].error}"
    return elapsed, math.ceil(episodes / concurrency) * TURNS * LATENCY_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,64,128,256", help="Concurrent episodes, comma-separated.")
    parser.add_argument("--waves", type=int, default=4, help="Episodes = waves x concurrency (at least 8).")
    parser.add_argument("--workflows", default="async,sync", help="async, sync or both.")
    args = parser.parse_args()
    workflows = {"async": AsyncAgent, "sync": SyncAgent}
    print(f"{TURNS}-turn tool conversations, engine latency {LATENCY_S * 1000:.0f} ms per call, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'workflow':8s} {'C':>5s} {'episodes':>9s} {'ideal s':>8s} {'measured s':>11s} {'efficiency':>11s} "
          f"{'calls/s':>8s}")
    efficiencies = {}
    for name in args.workflows.split(","):
        for level in (int(text) for text in args.levels.split(",")):
            episodes = max(8, args.waves * level)
            measured, ideal = asyncio.run(measure(workflows[name], level, episodes))
            efficiencies[name, level] = ideal / measured
            print(f"{name:8s} {level:5d} {episodes:9d} {ideal:8.2f} {measured:11.2f} {ideal / measured:11.3f} "
                  f"{episodes * TURNS / measured:8.0f}")
    for name in args.workflows.split(","):
        if (name, 128) in efficiencies:
            value = efficiencies[name, 128]
            print(f"target efficiency >= 0.9 at C=128 ({name}): {value:.3f} -> {'met' if value >= 0.9 else 'NOT met'}")


if __name__ == "__main__":
    main()
