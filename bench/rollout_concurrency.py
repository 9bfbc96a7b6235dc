"""How well the rollout engine overlaps episodes: efficiency = ideal time / measured time.

N episodes of a 4-turn tool-calling workflow (through `tuner`, the in-process transport, the real
gateway and RolloutEngine, an instant judge) against an engine that takes a fixed 50 ms per call and
serves any number of calls at once (a remote server with room to spare). With C episodes at a time
the ideal is ceil(N / C) waves x 4 turns x 50 ms; anything above that is CPU spent per call (the
agent's client library, the gateway, the rollout engine) or episodes waiting on each other.

Four workflows, the same conversation:
    handler       JSON bytes straight to the gateway's request handler, no client library: what
                  agenttune itself costs (the handler the in-process transport and HTTP server call)
    httpx         raw JSON with httpx on `tuner.channel.async_transport()`: the lightest real client
    openai-async  `tuner.as_async_openai_client()`, what most agents use
    openai-sync   `tuner.as_openai_client()` in a sync workflow (one thread per episode)

Each runs with the workflows in the trainer's process (processes = 1) and in worker processes
(`rollout.workflow_processes`, `--processes`), where each worker has its own event loop and its
own gateway, and only the engine calls reach the trainer's process.

Before the table it measures, side by side, the CPU one call costs in each client library (against a
canned in-memory reply) and in the gateway, which bounds calls/s on the one core an event loop has.
The table's last columns split the CPU of the measured run per call: the trainer's process, and the
workflow processes together.

`--ceiling K` adds, for every workflow and level, a row that shares nothing: K independent processes
of C / K episodes each (their own engine, gateway and rollout), started together. It is what the
machine's cores give this work when no process waits on another: a bound on any split of it.

    python bench/rollout_concurrency.py                        # C = 1, 16, 64, 128, 256, every workflow
    python bench/rollout_concurrency.py --levels 128 --workflows httpx --waves 8
    python bench/rollout_concurrency.py --latency-ms 200         # an engine that takes longer per call
    python bench/rollout_concurrency.py --levels 128 --processes 1,2,3
    python bench/rollout_concurrency.py --levels 128 --workflows handler,httpx --ceiling 2

Target: efficiency >= 0.9 at C = 128 (2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agenttune import Judge, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TURNS = 4
LATENCY_S = 0.050
START_TOGETHER_S = 600  # how long independent parts wait for each other to be warm
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"q": "France"}}\n</tool_call>'


def turn_messages(task: Task) -> list[dict]:
    return [{"role": "system", "content": "Look facts up with the tool, then answer."},
            {"role": "user", "content": task.query}]


def tool_result(message, turn: int) -> dict:
    return {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"Paris ({turn})"}


async def converse_with_handler(gateway, api_key: str, messages: list[dict]) -> None:
    """The conversation as JSON bytes straight to the gateway's request handler (no client library)."""
    headers = {"authorization": f"Bearer {api_key}"}
    for turn in range(TURNS):
        body = json.dumps({"model": "m", "messages": messages, "tools": TOOLS}).encode()
        message = json.loads((await gateway.handle("POST", "/v1/chat/completions", headers, body)).body)
        message = message["choices"][0]["message"]
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                               "content": f"Paris ({turn})"}]


class HandlerAgent(Workflow):
    async def execute(self, task, tuner):
        # the episode's gateway: the trainer's, or its worker's own
        await converse_with_handler(tuner.channel.gateway, tuner.api_key, turn_messages(task))
        return WorkflowOutput(metadata={"turns": TURNS})


class HttpxAgent(Workflow):
    async def execute(self, task, tuner):
        import httpx

        headers, messages = {"Authorization": f"Bearer {tuner.api_key}"}, turn_messages(task)
        async with httpx.AsyncClient(transport=tuner.channel.async_transport(), base_url="http://gateway") as client:
            for turn in range(TURNS):
                response = await client.post("/v1/chat/completions", headers=headers,
                                             json={"model": "m", "messages": messages, "tools": TOOLS})
                message = response.json()["choices"][0]["message"]
                messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                       "content": f"Paris ({turn})"}]
        return WorkflowOutput(metadata={"turns": TURNS})


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


WORKFLOWS = {"handler": HandlerAgent, "httpx": HttpxAgent, "openai-async": AsyncAgent, "openai-sync": SyncAgent}


class InstantJudge(Judge):
    name = "instant"

    async def judge(self, judge_input):
        return JudgeResult(reward=1.0, success=True)


@dataclass
class Measured:
    seconds: float
    ideal: float
    trainer_us: float  # CPU per call in the trainer's process
    workers_us: float | None  # CPU per call in the workflow processes together (None: not on Linux)


async def measure(workflow: type[Workflow], concurrency: int, episodes: int,
                  latency_s: float = LATENCY_S, processes: int = 1, before_timing=None) -> Measured:
    """`episodes` episodes, `concurrency` at a time: measured and ideal seconds, and CPU per call.

    `processes` > 1: the workflows run in that many worker processes (rollout.workflow_processes).
    `before_timing`: called after the warm-up, just before the timed run (to start runs together).
    """
    tokenizer = tiny_tokenizer()
    reply = tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine = ScriptedEngine(tokenizer=tokenizer, responder=lambda prompt, sampling: reply, delay=latency_s)
    config = tiny_config(model={"max_model_len": 8192},
                         rollout={"num_repeat": 1, "max_env_worker": concurrency, "episode_timeout": 600,
                                  "workflow_processes": processes})
    tasks = [Task(task_id=f"t{index}", query=f"What is the capital of France? ({index})") for index in range(episodes)]
    async with running_gateway(engine, config=config) as gateway:  # started as in a run
        rollout = RolloutEngine(config, gateway, workflow, InstantJudge())
        try:
            await rollout.run_tasks(tasks[: min(concurrency, 8)])  # warm up (processes, imports, templates)
            if before_timing is not None:
                before_timing()
            workers = [child.pid for child in multiprocessing.active_children()]
            cpu, workers_cpu, started = time.process_time(), _cpu_seconds(workers), time.perf_counter()
            results = await rollout.run_tasks(tasks)
            elapsed = time.perf_counter() - started
            cpu, workers_cpu = time.process_time() - cpu, _cpu_seconds(workers) - workers_cpu
        finally:
            await rollout.aclose()
    failed = [episode for episode in results if episode.status.failed or episode.metrics.get("calls") != TURNS]
    assert not failed, f"{len(failed)} episodes failed: {failed[0].error}"
    calls = episodes * TURNS
    return Measured(elapsed, math.ceil(episodes / concurrency) * TURNS * latency_s, cpu / calls * 1e6,
                    workers_cpu / calls * 1e6 if not math.isnan(workers_cpu) else None)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc; NaN elsewhere)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure_independent(name: str, parts: int, concurrency: int, episodes: int, latency_s: float) -> Measured:
    """`parts` processes of concurrency / parts episodes each, sharing nothing, timed together."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(parts), context.Queue()
    runs = [context.Process(target=_independent_part, args=(name, concurrency // parts, episodes // parts, latency_s,
                                                            start, results)) for _ in range(parts)]
    for run in runs:
        run.start()
    measured = [results.get() for _ in runs]
    for run in runs:
        run.join()
    failed = [part for part in measured if isinstance(part, BaseException)]
    if failed:
        raise failed[0]
    # Together they finish when the slowest does; each part is charged only its own calls.
    return Measured(max(part.seconds for part in measured), measured[0].ideal,
                    sum(part.trainer_us for part in measured) / parts, None)


def _independent_part(name, concurrency, episodes, latency_s, start, results) -> None:
    try:  # whatever happens, the parent hears back (it waits for one result per part)
        results.put(asyncio.run(measure(WORKFLOWS[name], concurrency, episodes, latency_s,
                                        before_timing=lambda: start.wait(START_TOGETHER_S))))
    except BaseException as error:
        start.abort()  # the other parts stop waiting for this one
        results.put(RuntimeError(f"an independent part failed: {type(error).__name__}: {error}"))


# -- CPU per call, side by side -------------------------------------------------------------------------------
def conversation_at(turn: int) -> list[dict]:
    """The messages of the conversation's `turn`-th call (0-based)."""
    messages = turn_messages(Task(task_id="t", query="What is the capital of France?"))
    for index in range(turn):
        call = {"id": f"call_{index}", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "France"}'}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": f"Paris ({index})"}]
    return messages


def cpu_per_call(call, repeats: int = 200) -> float:
    """Microseconds of CPU per `call()` (an awaitable factory), after a warm-up."""
    async def run() -> float:
        for _ in range(20):
            await call()
        started = time.process_time()
        for _ in range(repeats):
            await call()
        return (time.process_time() - started) / repeats * 1e6

    return asyncio.run(run())


def print_call_costs(latency_s: float) -> None:
    import httpx
    import openai

    canned = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=canned))
    messages = conversation_at(TURNS - 1)  # the longest call of the conversation
    raw = httpx.AsyncClient(transport=transport, base_url="http://x")
    async_sdk = openai.AsyncOpenAI(base_url="http://x/v1", api_key="k", max_retries=0,
                                   http_client=httpx.AsyncClient(transport=transport))
    sync_sdk = openai.OpenAI(base_url="http://x/v1", api_key="k", max_retries=0,
                             http_client=httpx.Client(transport=transport))

    async def sync_call():
        sync_sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)

    costs = {
        "httpx": cpu_per_call(lambda: raw.post("/v1/chat/completions", json={"model": "m", "messages": messages,
                                                                              "tools": TOOLS})),
        "openai-async": cpu_per_call(lambda: async_sdk.chat.completions.create(model="m", messages=messages,
                                                                                tools=TOOLS)),
        "openai-sync": cpu_per_call(sync_call),
        # The known workaround for the SDK's client-side request transform: the same body via extra_body.
        "openai-async/extra_body": cpu_per_call(lambda: async_sdk.chat.completions.create(
            model="m", messages=[], extra_body={"messages": messages, "tools": TOOLS})),
    }
    gateway = gateway_cpu_per_call()
    needed = 128 / latency_s  # calls/s that keep 128 episodes busy
    print(f"CPU per call (the conversation's last call, {len(messages)} messages): gateway {gateway:.0f} us; client "
          + ", ".join(f"{name} {cost:.0f} us" for name, cost in costs.items()))
    print(f"C=128 needs {needed:.0f} calls/s; one core gives at most 1e6 / (client + gateway) calls/s: "
          + ", ".join(f"{name} {1e6 / (cost + gateway):.0f}" for name, cost in costs.items()))
    print()


def gateway_cpu_per_call() -> float:
    """The gateway's own CPU per call (its request handler, no transport), over whole conversations."""
    tokenizer = tiny_tokenizer()
    reply = tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    engine = ScriptedEngine(tokenizer=tokenizer, responder=lambda prompt, sampling: reply)

    async def run() -> float:
        async with running_gateway(engine, config=tiny_config(model={"max_model_len": 8192}), http=False) as gateway:
            async def conversation(index: int) -> None:
                channel = gateway.open_episode(f"e{index}")
                await converse_with_handler(gateway, channel.key, conversation_at(0))
                gateway.close_episode(channel)

            for index in range(10):
                await conversation(index)
            started = time.process_time()
            for index in range(100):
                await conversation(index)
            return (time.process_time() - started) / (100 * TURNS) * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,64,128,256", help="Concurrent episodes, comma-separated.")
    parser.add_argument("--latency-ms", type=float, default=LATENCY_S * 1000, help="Engine latency per call.")
    parser.add_argument("--waves", type=int, default=4, help="Episodes = waves x concurrency (at least 8).")
    parser.add_argument("--workflows", default=",".join(WORKFLOWS), help="Comma-separated: " + ", ".join(WORKFLOWS))
    parser.add_argument("--processes", default="1,2", help="rollout.workflow_processes values, comma-separated.")
    parser.add_argument("--ceiling", type=int, default=0,
                        help="Also run K independent processes of C / K episodes each, sharing nothing.")
    args = parser.parse_args()
    latency_s = args.latency_ms / 1000
    print(f"{TURNS}-turn tool conversations, engine latency {args.latency_ms:.0f} ms per call, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print_call_costs(latency_s)
    print(f"{'workflow':12s} {'processes':>9s} {'C':>5s} {'episodes':>9s} {'ideal s':>8s} {'measured s':>11s} "
          f"{'efficiency':>11s} {'calls/s':>8s} {'trainer us/call':>16s} {'workers us/call':>16s}")
    efficiencies = {}
    for name in args.workflows.split(","):
        settings = [(str(count), count) for count in (int(text) for text in args.processes.split(","))]
        if args.ceiling > 1:
            settings.append((f"{args.ceiling} indep", None))
        for label, processes in settings:
            for level in (int(text) for text in args.levels.split(",")):
                if processes is None and level % args.ceiling:
                    continue  # the parts must split C evenly
                episodes = max(8, args.waves * level)
                if processes is None:
                    run = measure_independent(name, args.ceiling, level, episodes, latency_s)
                else:
                    run = asyncio.run(measure(WORKFLOWS[name], level, episodes, latency_s, processes))
                efficiencies[name, label, level] = run.ideal / run.seconds
                workers = "-" if run.workers_us is None or processes == 1 else f"{run.workers_us:.0f}"
                print(f"{name:12s} {label:>9s} {level:5d} {episodes:9d} {run.ideal:8.2f} {run.seconds:11.2f} "
                      f"{run.ideal / run.seconds:11.3f} {episodes * TURNS / run.seconds:8.0f} "
                      f"{run.trainer_us:16.0f} {workers:>16s}")
    if args.latency_ms == LATENCY_S * 1000:  # the target is set at 50 ms
        for (name, label, level), value in efficiencies.items():
            if level == 128:
                print(f"target efficiency >= 0.9 at C=128 ({name}, processes {label}): "
                      f"{value:.3f} -> {'met' if value >= 0.9 else 'NOT met'}")


if __name__ == "__main__":
    main()
