"""Time to the first streamed chunk, in decode steps (issue 23 target: <= 2 decode steps + gateway overhead).

    python bench/streaming_latency.py                 # tiny model, hf engine, CPU; 1 and 16 streams at once
    python bench/streaming_latency.py --concurrency 1,64 --requests 128

Each request streams a reply from the `hf` engine through the gateway's HTTP server with the real
`openai` client (`stream=True`). Measured per request: the time from sending to the first chunk
that carries generated text (the role chunk that leaves first does not count), and the time between
text chunks after it — one decode step each, as the engine hands each step's token over. Printed:
medians, and time-to-first-text over the median decode step. The first text needs the prefill and
one decode step's sampling, so about 1-2 steps is the floor; a reply whose first tokens might still
open a `<think>` block (leading newlines) waits until they cannot. For comparison, the engine alone:
the time from submitting one request to its first streamed token (prefill + sampling + hand-over);
the difference is the gateway's and the HTTP client's share.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

from agenttune.components.engines.base import SamplingParams
from agenttune.registry.resolution import build_engine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

MESSAGES = [{"role": "user", "content": "Tell me a story about a city by the sea."}]


async def one_stream(channel, base_url: str) -> tuple[float, list[float]]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=channel.api_key(), max_retries=0)
    started = time.perf_counter()
    first, gaps, last = None, [], None
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    async for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None or not (delta.content or getattr(delta, "reasoning_content", None)):
            continue
        now = time.perf_counter()
        if first is None:
            first = now - started
        else:
            gaps.append(now - last)
        last = now
    await client.close()
    return first, gaps


async def engine_first_token(engine, prompt_ids: list[int], seed: int) -> float:
    """The engine alone: from submitting to its first streamed token."""
    started = time.perf_counter()
    events = engine.generate_stream(prompt_ids, SamplingParams(temperature=1.0, max_tokens=4, seed=seed))
    async for _ in events:
        first = time.perf_counter() - started
        break
    await events.aclose()
    return first


async def measure(concurrency: int, requests: int, max_tokens: int) -> dict[str, float]:
    config = tiny_config(rollout={"max_response_length_in_one_turn": max_tokens},
                         engine={"type": "hf", "max_batch_size": max(concurrency, 1)})
    engine = build_engine(config, tiny_tokenizer())
    firsts, gaps = [], []
    async with running_gateway(engine, config=config, http=True) as gateway:
        seed = 0
        for _ in range(max(requests // concurrency, 1) + 1):  # the first round warms up
            channels = []
            for _ in range(concurrency):
                seed += 1
                channels.append(gateway.open_episode(f"s{seed}", SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                                                 seed=seed)))
            results = await asyncio.gather(*(one_stream(channel, gateway.base_url) for channel in channels))
            if seed > concurrency:
                for first, step_gaps in results:
                    if first is not None:
                        firsts.append(first)
                    gaps += step_gaps
        prompt_ids = gateway.renderer.encode(gateway.renderer.render(MESSAGES, [], add_generation_prompt=True))
        engine_firsts = [await engine_first_token(engine, prompt_ids, seed) for seed in range(8)]
    await engine.aclose()
    step = statistics.median(gaps)
    return {"first_ms": statistics.median(firsts) * 1000, "step_ms": step * 1000,
            "first_steps": statistics.median(firsts) / step,
            "engine_first_ms": statistics.median(engine_firsts) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    print("streams at once | time to first text | decode step (median gap) | first text in decode steps | "
          "engine alone: first token (one request)")
    for concurrency in (int(level) for level in args.concurrency.split(",")):
        result = asyncio.run(measure(concurrency, args.requests, args.max_tokens))
        print(f"{concurrency:15d} | {result['first_ms']:15.1f} ms | {result['step_ms']:21.1f} ms | "
              f"{result['first_steps']:26.2f} | {result['engine_first_ms']:.1f} ms "
              f"({result['engine_first_ms'] / result['step_ms']:.2f} steps)")


if __name__ == "__main__":
    main()
