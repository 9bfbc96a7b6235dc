"""How many tokens a trainer processes with timeline merging, against one sample per LLM call.

Tool-calling trajectories of 2, 4, 8 and 16 turns (a system prompt with tools, a question, then a
tool call and a tool result per turn, and a final answer) go through the real gateway with a
scripted model. Three counts per trajectory:

    per-call   one training sample per LLM call: every call's prompt + its generation (how Trinity's
               history mode and Agent Lightning's default transition mode train)
    merged     agenttune's samples after timeline merging (prompt + response of every sample)
    unique     the physical limit: the final conversation rendered by the chat template once,
               every token counted once (computed independently of the gateway)

    python bench/merge_compression.py
    python bench/merge_compression.py --turns 2,4,8,16,32 --tool-result-words 80

The trained tokens (generated, loss mask 1) are the same either way; merging removes the repeated
context. Ratios: per-call / merged (the saving) and merged / unique (1.00 = nothing is processed twice).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.gateway.rendering import ChatRenderer
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the web and return the top results.",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string", "description": "What to search for."}},
                                          "required": ["query"]}}},
    {"type": "function", "function": {"name": "execute_python_code", "description": "Run Python code; returns stdout.",
                                      "parameters": {"type": "object", "properties": {
                                          "code": {"type": "string", "description": "The code."}},
                                          "required": ["code"]}}},
]
SYSTEM = "You are a helpful research assistant. Use the tools to find facts and compute, then answer briefly."
WORDS = ("the capital of France is Paris population city river Seine museum result value total number of "
         "people year century history tower bridge").split()


def tool_call(turn: int) -> str:
    if turn % 2:
        arguments = {"code": f"print(sum(range({turn * 7})) * {turn})"}
        return f'<tool_call>\n{json.dumps({"name": "execute_python_code", "arguments": arguments})}\n</tool_call>'
    return f'<tool_call>\n{json.dumps({"name": "search", "arguments": {"query": f"Paris facts part {turn}"}})}\n</tool_call>'


def tool_result(turn: int, words: int) -> str:
    rng = random.Random(turn)
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def trajectory(turns: int, words: int) -> dict[str, int]:
    """One episode of `turns` calls through the gateway; returns its token counts."""
    tokenizer = tiny_tokenizer()
    replies = [tool_call(turn) for turn in range(turns - 1)] + ["Paris has about two million people."]
    engine = ScriptedEngine(replies, tokenizer=tokenizer)
    config = tiny_config(model={"max_model_len": 1 << 20}, rollout={"max_response_length_in_one_turn": 256})
    async with running_gateway(engine, config=config, http=False) as gateway:
        channel = gateway.open_episode("bench")
        headers = {"authorization": f"Bearer {channel.key}"}
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "How many people live in the capital of France?"}]
        for turn in range(turns):
            body = json.dumps({"model": "m", "messages": messages, "tools": TOOLS}).encode()
            reply = await gateway.handle("POST", "/v1/chat/completions", headers, body)
            assert reply.status == 200, reply.body
            message = json.loads(reply.body)["choices"][0]["message"]
            messages.append(message)
            for call in message.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(turn, words)})
        samples, metrics = channel.samples(), channel.metrics()
    renderer = ChatRenderer(tokenizer)
    unique = len(renderer.encode(renderer.render(messages, TOOLS, add_generation_prompt=False)))
    return {
        "calls": int(metrics["calls"]),
        "samples": len(samples),
        "per_call": int(metrics["prompt_tokens"] + metrics["generated_tokens"]),
        "merged": sum(len(sample.prompt_ids) + len(sample.response_ids) for sample in samples),
        "unique": unique,
        "trained": sum(sample.num_trained_tokens for sample in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="2,4,8,16", help="Trajectory lengths (LLM calls), comma-separated.")
    parser.add_argument("--tool-result-words", type=int, default=40, help="Words in each tool result.")
    args = parser.parse_args()
    print(f"tool-calling trajectories, {args.tool_result_words}-word tool results, the tiny model's tokenizer")
    print(f"{'turns':>5s} {'samples':>7s} {'trained':>8s} {'per-call':>9s} {'merged':>8s} {'unique':>8s} "
          f"{'per-call/merged':>16s} {'merged/unique':>14s} {'per-call/unique':>16s}")
    for turns in (int(text) for text in args.turns.split(",")):
        counts = asyncio.run(trajectory(turns, args.tool_result_words))
        assert counts["calls"] == turns
        print(f"{turns:5d} {counts['samples']:7d} {counts['trained']:8d} {counts['per_call']:9d} {counts['merged']:8d} "
              f"{counts['unique']:8d} {counts['per_call'] / counts['merged']:16.2f} "
              f"{counts['merged'] / counts['unique']:14.3f} {counts['per_call'] / counts['unique']:16.2f}")


if __name__ == "__main__":
    main()
