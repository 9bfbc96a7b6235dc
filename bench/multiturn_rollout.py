"""The `hf` engine under an agent's load: many episodes of a multi-turn conversation at once.

    python bench/multiturn_rollout.py                        # 128 episodes x 4 turns, <= 32 new tokens a turn
    python bench/multiturn_rollout.py --episodes 256 --max-batch-size 64

Each episode is a 4-turn conversation through the real product path — the workflow's OpenAI client,
the gateway, RolloutEngine — against the batching `hf` engine on the tiny model (CPU, random
weights). Episodes send turn 2 while others are still in turn 1, which is where static batches lose:
a request that arrives while a batch decodes waits for the whole batch.

Printed: generated tokens/s over the whole rollout, and the batch occupancy: the rows decoded per
decode step over the requests in flight at that step (decoding + queued), summed over all steps.
1.0 means no request ever waited for a batch to finish. Target (issue 20): occupancy >= 0.8.
Also the GIL question: the share of its wall time in batches the decode thread spent on a CPU (the
rest it waited for the GIL the event loop held, or for a core), and the event loop thread's CPU
share of the run. `--cpu-threads N` sets the engine's `cpu_threads` (the decode thread's intra-op
threads; default half of torch's), `--no-lean-forward` runs transformers' forward pass instead of
the engine's lean one.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agenttune import Judge, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.hf import HFOptions
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing.gateways import running_gateway, tiny_config

TURNS = 4


class FourTurns(Workflow):
    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "user", "content": task.query}]
        for turn in range(TURNS):
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"And then? ({turn + 1})"}]
        return WorkflowOutput(reward=1.0, metadata={"turns": TURNS})


class NoJudge(Judge):
    def judge(self, judge_input):
        return JudgeResult(reward=1.0)


async def measure(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from agenttune.backbones.local.loop import engine_metrics
    from agenttune.components.engines.hf import HFEngine
    from agenttune.components.engines.model_loading import load_model, load_tokenizer

    torch.manual_seed(0)
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": args.episodes, "temperature": 1.0,
                                  "max_response_length_in_one_turn": args.max_tokens})
    tokenizer = load_tokenizer(config.model)
    engine = HFEngine(load_model(config.model, device="cpu"), tokenizer, max_batch_size=args.max_batch_size,
                      max_model_len=config.model.max_model_len, cpu_threads=args.cpu_threads,
                      lean_forward=args.lean_forward)
    tasks = [Task(task_id=f"t{i}", query=f"What is {17 * i + 3} + {29 * i + 5}?") for i in range(args.episodes)]
    async with running_gateway(engine, tokenizer=tokenizer, config=config) as gateway:
        rollout = RolloutEngine(config, gateway, FourTurns, NoJudge())
        await rollout.run_tasks(tasks[: min(8, len(tasks))])  # warm-up: threads, caches
        counted = engine.counters()
        started, loop_cpu = time.perf_counter(), time.thread_time()
        episodes = await rollout.run_tasks(tasks)
        elapsed, loop_cpu = time.perf_counter() - started, time.thread_time() - loop_cpu
        run = engine_metrics(counted, engine.counters())  # what the local backbone logs per step
    await engine.aclose()
    generated = sum(episode.metrics.get("generated_tokens", 0.0) for episode in episodes)
    return {"episodes": len(episodes), "failed": sum(e.status.failed for e in episodes),
            "calls": sum(e.metrics.get("calls", 0.0) for e in episodes), "seconds": elapsed,
            "tokens/s": generated / elapsed, "decode steps": run["engine/decode_steps"],
            "mean rows per step": run["engine/rows_per_decode_step"], "occupancy": run["engine/occupancy"],
            "ms per decode step": run["engine/decode_ms_per_step"],
            # The GIL question: how much of its time in batches the decode thread ran, and how busy the
            # event loop (gateway, clients, workflows) kept the other core.
            "decode thread on CPU": run["engine/decode_cpu_s"] / max(run["engine/decode_s"], 1e-9),
            "event loop on CPU": loop_cpu / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32, help="most new tokens per turn")
    parser.add_argument("--max-batch-size", type=int, default=HFOptions().max_batch_size,
                        help="the hf engine's max_batch_size (default: the engine's default)")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="the decode thread's intra-op threads (default: the engine's, half of torch's)")
    parser.add_argument("--no-lean-forward", dest="lean_forward", action="store_false",
                        help="transformers' forward pass instead of the engine's lean one")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    if result["failed"]:
        raise SystemExit(f"{result['failed']} episodes failed (see the log above): the figures would mean nothing")
    for key, value in result.items():
        print(f"{key:>20}: {value:,.3f}" if isinstance(value, float) else f"{key:>20}: {value}")
    print(f"target occupancy >= 0.8: {result['occupancy']:.2f} -> {'met' if result['occupancy'] >= 0.8 else 'not met'}")


if __name__ == "__main__":
    main()
