"""Several policies in one run (docs/multi_policy.md): what a batch mixing two LoRA adapters costs the `hf` engine.

    python bench/multi_policy.py --json runs/bench/multi_policy.json
    python bench/multi_policy.py --rows 128 --max-tokens 64 --rounds 5

The same model (tiny://default with two rank-8 adapters on every linear layer) and the same requests
(`--rows` prompts of ~24 tokens, `--max-tokens` sampled tokens each, seeded) are generated through the
engine's `generate`, all at once, two ways, interleaved over `--rounds` rounds:

- one adapter: every row samples with the model's active adapter (what a run with one policy does);
- mixed: half the rows name one adapter, half the other (what a run with two policies does: peft's
  per-row adapter selection, components/engines/adapter_rows.py).

`mixed_batch_tokens_per_s_ratio` is the median over rounds of mixed tokens/s divided by one-adapter
tokens/s in the same round (target >= 0.8). `shared_final_accuracy` / `separate_final_accuracy` (the
two-agent example trained with one shared policy against two) are not measured yet: null.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

ADAPTERS = ("proposer", "checker")


def two_adapter_model(model_path: str, rank: int):
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from agenttune.components.engines.model_loading import resolve_model_path

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), dtype=torch.float32)
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": "all-linear", "init_lora_weights": False}
    model = peft.get_peft_model(base, peft.LoraConfig(**config), adapter_name=ADAPTERS[0])
    model.add_adapter(ADAPTERS[1], peft.LoraConfig(**config))
    return model.eval()


async def tokens_per_s(engine, prompts: list[list[int]], adapters: list[str | None], max_tokens: int) -> float:
    from agenttune.components.engines.base import SamplingParams

    started = time.perf_counter()
    generations = await asyncio.gather(*[
        engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=row, adapter=adapter))
        for row, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True))])
    elapsed = time.perf_counter() - started
    return sum(len(generation.token_ids) for generation in generations) / elapsed


async def measure(args: argparse.Namespace) -> dict:
    import torch

    from agenttune.components.engines.hf import HFEngine
    from agenttune.components.engines.model_loading import load_tokenizer
    from agenttune.config.models import ModelConfig

    model = two_adapter_model(args.model, args.rank)
    tokenizer = load_tokenizer(ModelConfig(path=args.model))
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, model.config.vocab_size, (24,), generator=generator).tolist() for _ in range(args.rows)]
    ways = {"one_adapter": [None] * args.rows,
            "mixed": [ADAPTERS[row % 2] for row in range(args.rows)]}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    ratios = []
    for _ in range(args.rounds + 1):  # the first round warms up and is not counted
        round_rates = {}
        for name, adapters in ways.items():
            engine = HFEngine(model, tokenizer, max_batch_size=args.rows)
            round_rates[name] = await tokens_per_s(engine, prompts, adapters, args.max_tokens)
            await engine.aclose()
        for name, rate in round_rates.items():
            rates[name].append(rate)
        ratios.append(round_rates["mixed"] / round_rates["one_adapter"])
    return {
        "model": args.model, "rank": args.rank, "rows": args.rows, "max_tokens": args.max_tokens,
        "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
        "one_adapter_tokens_per_s": statistics.median(rates["one_adapter"][1:]),
        "mixed_tokens_per_s": statistics.median(rates["mixed"][1:]),
        "mixed_batch_tokens_per_s_ratio": statistics.median(ratios[1:]),
        "mixed_batch_tokens_per_s_ratios": ratios[1:],
        "shared_final_accuracy": None,
        "separate_final_accuracy": None,
        "not_measured": "shared_final_accuracy / separate_final_accuracy: the two-agent example is not written yet",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny://default")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(f"{args.model}, two rank-{args.rank} adapters, {args.rows} rows x {args.max_tokens} tokens: one adapter "
          f"{result['one_adapter_tokens_per_s']:.0f} tokens/s, mixed {result['mixed_tokens_per_s']:.0f} tokens/s, "
          f"ratio {result['mixed_batch_tokens_per_s_ratio']:.2f} (target >= 0.8; per round "
          f"{', '.join(f'{r:.2f}' for r in result['mixed_batch_tokens_per_s_ratios'])})")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
