"""What enforcing tool_choice / response_format costs, and whether it always holds (issue 23 item 2).

    python bench/grammar_cost.py                  # 64 requests of each kind through the gateway, tiny model, CPU
    python bench/grammar_cost.py --requests 128

Three measurements:
1. The grammar libraries side by side (the choice in src/agenttune/components/engines/grammar.py): the time to
   mask the vocabulary and advance the grammar, per decode step, stepping one matcher through a
   valid JSON reply token by token (xgrammar; llguidance too when it is installed).
2. The `hf` engine's time per decode step with and without a guide: the same concurrent requests
   (free text, then `tool_choice: required`) through the gateway; each step's cost is the elapsed
   time over the decode steps the engine ran, and over the rows those steps decoded (a step's cost
   grows with its rows, and free-text rows finish at other times than guided ones). The ratio per
   row-step is the grammar's cost.
3. How often the guide held: the share of `tool_choice: required` replies that are tool calls whose
   arguments validate against their tool's schema, and of `json_schema` replies that parse and
   validate (targets: 100 %), and the share that ran out of tokens (`finish_reason: length`: a reply
   cut off inside a call is not one). The tiny model has random weights: unguided, it almost never
   writes either; with parallel calls allowed it may go on calling until its tokens run out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import jsonschema
import openai

from agenttune.registry.resolution import build_engine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}
REPLY_TEXT = json.dumps({"city": "Paris", "days": 3})
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def library_costs(tokenizer, repeats: int = 20) -> dict[str, float]:
    """Microseconds per step (mask the vocabulary + advance) for each installed grammar library."""
    schema = WEATHER["function"]["parameters"]
    ids = tokenizer.encode(REPLY_TEXT, add_special_tokens=False)
    costs = {}
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema))
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def xgrammar_run():
        matcher = xgrammar.GrammarMatcher(compiled)
        for token in ids:
            matcher.fill_next_token_bitmask(bitmask)
            matcher.accept_token(token)

    costs["xgrammar"] = _best_us_per_step(xgrammar_run, len(ids), repeats)
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError:
        return costs
    lltokenizer = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    llmask = llguidance.torch.allocate_token_bitmask(1, lltokenizer.vocab_size)

    def llguidance_run():
        matcher = llguidance.LLMatcher(lltokenizer, grammar)
        for token in ids:
            llguidance.torch.fill_next_token_bitmask(matcher, llmask, 0)
            matcher.consume_token(token)

    costs["llguidance"] = _best_us_per_step(llguidance_run, len(ids), repeats)
    return costs


def _best_us_per_step(run, steps: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / steps * 1e6


async def through_the_gateway(requests: int, max_tokens: int) -> dict[str, dict[str, float]]:
    tokenizer = tiny_tokenizer()
    config = tiny_config(rollout={"max_response_length_in_one_turn": max_tokens, "max_turns": 10**6},
                         engine={"type": "hf", "max_batch_size": requests})
    engine = build_engine(config, tokenizer)
    kinds = {"free text": {"tools": [WEATHER]},
             "tool_choice required": {"tools": [WEATHER], "tool_choice": "required"},
             "required, one call": {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False},
             "json_schema": {"response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "answer", "schema": ANSWER}}}}
    results = {}
    async with running_gateway(engine, config=config) as gateway:
        await _ask(gateway, 4, kinds["tool_choice required"])  # warm-up: model, grammar compiled once
        for name, body in kinds.items():
            steps_before, started = len(engine.decode_steps), time.perf_counter()
            replies = await _ask(gateway, requests, body)
            elapsed, steps = time.perf_counter() - started, engine.decode_steps[steps_before:]
            truncated = sum(reply.choices[0].finish_reason == "length" for reply in replies) / len(replies)
            rows = sum(decoded for decoded, _ in steps)
            results[name] = {"ms_per_step": elapsed / len(steps) * 1000, "us_per_row": elapsed / rows * 1e6,
                             "held": _held(name, replies),
                             "truncated": truncated}
    await engine.aclose()
    return results


async def _ask(gateway, count: int, body: dict) -> list:
    channels = [gateway.open_episode(f"bench-{index}") for index in range(count)]
    clients = [openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                  http_client=httpx.AsyncClient(transport=channel.async_transport()))
               for channel in channels]
    return await asyncio.gather(*(client.chat.completions.create(model="m", messages=MESSAGES, **body)
                                  for client in clients))


def _held(kind: str, replies: list) -> float:
    """The share of replies that are what the request asked for."""
    good = 0
    for reply in replies:
        message = reply.choices[0].message
        try:
            if kind == "json_schema":
                jsonschema.validate(json.loads(message.content), ANSWER)
            elif not message.tool_calls:
                raise ValueError("no tool call")
            else:
                for call in message.tool_calls:
                    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
            good += 1
        except (ValueError, TypeError, jsonschema.ValidationError):
            continue
    return good / len(replies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    print("grammar libraries, mask + advance per decode step (one row, the tiny tokenizer):")
    for name, cost in library_costs(tiny_tokenizer()).items():
        print(f"  {name:12s} {cost:8.1f} us")
    results = asyncio.run(through_the_gateway(args.requests, args.max_tokens))
    free = results["free text"]["us_per_row"]
    print(f"hf engine, {args.requests} concurrent requests, <= {args.max_tokens} tokens each (CPU, tiny model):")
    for name, result in results.items():
        held = "" if name == "free text" else (f"   held: {result['held']:.0%}; out of tokens: "
                                               f"{result['truncated']:.0%}")
        print(f"  {name:22s} {result['ms_per_step']:7.2f} ms/step, {result['us_per_row']:6.0f} us/row-step "
              f"({result['us_per_row'] / free:.2f}x free text){held}")
    print(f"  (free text that happened to be a valid tool call: {results['free text']['held']:.0%})")


if __name__ == "__main__":
    main()
