"""Write data/demos.jsonl: worked GAIA-style conversations for the supervised warm-up.

    python examples/gaia_aworld/write_demos.py

A tiny model never produces a tool call or an <answer> on its own, and RL cannot reinforce what is
never sampled: the smoke config's warm-up (`local.warmup`) first teaches the format on these. Each
demonstration is a train question, one tool call, the tool's real result (computed by
gaia_tools_server.py's own functions) and the answer, with the tools as AWorld offers them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import gaia_tools_server as tools
from gaia_agent import SYSTEM_PROMPT

HERE = Path(__file__).resolve().parent

# task id -> (tool, arguments); the answer is the task's ground truth
PLANS = {
    "g1": ("calculate", {"expression": "330 / 93"}),
    "g2": ("calculate", {"expression": "1991 - 1969"}),
    "g3": ("convert_units", {"value": 8849, "from_unit": "m", "to_unit": "km"}),
    "g4": ("search", {"query": "largest ocean"}),
    "g5": ("search", {"query": "planets in the solar system"}),
    "g6": ("convert_units", {"value": 330, "from_unit": "m", "to_unit": "ft"}),
    "g7": ("search", {"query": "planets in the solar system"}),
    "g8": ("calculate", {"expression": "299792 * 3"}),
}


def openai_tools() -> list[dict]:
    listed = asyncio.run(tools.server.list_tools())
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                              "parameters": tool.inputSchema}} for tool in listed]


def demonstration(task: dict, tool_specs: list[dict]) -> dict:
    name, arguments = PLANS[task["task_id"]]
    result = getattr(tools, name)(**arguments)
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
        {"role": "assistant", "content": f"<answer>{task['answer']}</answer>"},
    ]
    return {"messages": messages, "tools": tool_specs}


def main() -> None:
    tasks = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()]
    specs = openai_tools()
    rows = [demonstration(task, specs) for task in tasks]
    (HERE / "data" / "demos.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} demonstrations to {HERE / 'data' / 'demos.jsonl'}")


if __name__ == "__main__":
    main()
