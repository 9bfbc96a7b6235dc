"""What a judge call costs in a worker process, a thread, or on the event loop, side by side.

    python bench/judge_isolation.py                 # 400 calls each, 16 at once
    python bench/judge_isolation.py --calls 2000 --json /tmp/judges.json

The judge is agenttune.testing.faults' FaultyJudge with no fault: a string-length check, about
the cheapest real judge, so the figure is the isolation's own overhead (pickling the episode's
input and result across a socket, the watchdog's polling). The input carries a 20-message
conversation, as an agent's episode would. Printed per mode: microseconds per call (wall time of
the batch / calls, `--parallel` at once) and the ratio to `loop`. The default (`judge.isolation:
process`) was chosen on this: see docs/reliability.md. Worker start-up is reported apart (once per
run, before the first episode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from agenttune.components.judges.base import JudgeInput
from agenttune.config.models import JudgeConfig
from agenttune.rollout.judging import JudgeProcesses, call_judge
from agenttune.testing.faults import FaultyJudge
from agenttune.workflow.base import WorkflowOutput
from agenttune.workflow.task import Task


def judge_input(index: int) -> JudgeInput:
    messages = [{"role": "user" if turn % 2 == 0 else "assistant", "content": f"turn {turn}: " + "words " * 40}
                for turn in range(20)]
    return JudgeInput(task=Task(task_id=f"task-{index}", query="What is 6 x 7?", metadata={"ground_truth": "42"}),
                      output=WorkflowOutput(metadata={"final_answer": "42"}), handed={"final_answer": "42"},
                      messages=messages)


async def batch(call, calls: int, parallel: int) -> float:
    inputs = [judge_input(index) for index in range(calls)]
    gate = asyncio.Semaphore(parallel)

    async def one(item: JudgeInput) -> None:
        async with gate:
            await call(item)

    started = time.perf_counter()
    await asyncio.gather(*(one(item) for item in inputs))
    return time.perf_counter() - started


async def measure(calls: int, parallel: int, workers: int) -> dict[str, float]:
    judge, config = FaultyJudge(), JudgeConfig(workers=workers)
    processes = JudgeProcesses(judge, config)
    started = time.perf_counter()
    await processes.start()
    startup = time.perf_counter() - started
    modes = {
        "loop": lambda item: call_judge(judge, item, config.timeout, "loop"),
        "thread": lambda item: call_judge(judge, item, config.timeout, "thread"),
        "process": processes.call,
    }
    try:
        for call in modes.values():  # warm-up: imports, first pickles
            await batch(call, parallel, parallel)
        wall = {name: await batch(call, calls, parallel) for name, call in modes.items()}
    finally:
        await processes.stop()
    result = {f"{name}_us_per_call": seconds / calls * 1e6 for name, seconds in wall.items()}
    result.update({f"{name}_vs_loop": wall[name] / wall["loop"] for name in ("thread", "process")})
    result["process_startup_s"] = startup
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", help="Write the figures to this file.")
    args = parser.parse_args()
    result = asyncio.run(measure(args.calls, args.parallel, args.workers))
    for name in ("loop", "thread", "process"):
        ratio = "" if name == "loop" else f"  ({result[f'{name}_vs_loop']:.1f}x loop)"
        print(f"{name:8s} {result[f'{name}_us_per_call']:9.0f} us per call{ratio}")
    print(f"starting {args.workers} judge workers: {result['process_startup_s']:.2f} s (once per run)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
