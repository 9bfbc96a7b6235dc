"""Several policies in one run (docs/multi_policy.md): two policies against one shared policy on the two-agent
example, and what a batch mixing two LoRA adapters costs the `hf` engine.

    python bench/multi_policy.py --json runs/bench/multi_policy.json             # both parts
    python bench/multi_policy.py --only speed --rows 128 --max-tokens 64 --rounds 5
    python bench/multi_policy.py --only accuracy --steps 16 --work-dir runs/bench/two_policies

Accuracy (`shared_final_accuracy`, `separate_final_accuracy`): examples/two_policies (a proposer and a
checker with opposed goals on the quickstart's arithmetic) trained `--steps` GRPO steps twice from the same
warmed-up base model, with the same seeds, tasks and settings: once with two policies (an adapter per agent,
the example's YAML), once with one adapter both agents share (`run.py --one-policy`: the same rank, alpha
and learning rate, each agent's samples still trained on its own reward in groups of its own). Each
figure is the held-out accuracy after the last step (greedy, the 200 validation problems: the checker's
final answer right). Target: separate >= shared. The warm-up is done once and kept in `--work-dir`.

Speed:

The same model (tiny://default with two rank-8 adapters on every linear layer) and the same requests
(`--rows` prompts of ~24 tokens, `--max-tokens` sampled tokens each, seeded) are generated through the
engine's `generate`, all at once, two ways, interleaved over `--rounds` rounds:

- one adapter: every row samples with the model's active adapter (what a run with one policy does);
- mixed: half the rows name one adapter, half the other (what a run with two policies does: peft's
  per-row adapter selection, components/engines/adapter_rows.py).

`mixed_batch_tokens_per_s_ratio` is the median over rounds of mixed tokens/s divided by one-adapter
tokens/s in the same round (target >= 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "two_policies"
ADAPTERS = ("proposer", "checker")
PARTS = ("speed", "accuracy")


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
    }


def accuracy(args: argparse.Namespace) -> dict[str, Any]:
    """The example trained with two policies and with one shared policy: held-out accuracy after `--steps`."""
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="two-policies-"))).resolve()
    sys.path.insert(0, str(EXAMPLE))
    from run import prepare  # the example's own data and warm-up: same tasks, same seeds

    started = time.perf_counter()
    prepare(work / "data")
    result: dict[str, Any] = {"steps": args.steps, "warmup_seconds": round(time.perf_counter() - started, 1)}
    for name, extra in (("separate", []), ("shared", ["--one-policy"])):
        result[name] = train_example(work / "runs" / name, work / "data", args.steps, extra)
        print(name, json.dumps(result[name]), flush=True)
    for name in ("separate", "shared"):
        result[f"{name}_final_accuracy"] = result[name].get("final_accuracy")
        result[f"{name}_final_reward"] = result[name].get("final_reward")
    return result


def train_example(run_dir: Path, data: Path, steps: int, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, str(EXAMPLE / "run.py"), *extra, "--data", str(data), "--run-dir", str(run_dir),
               f"trainer.total_steps={steps}", f"trainer.test_freq={steps}", "local.plot=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    log = run_dir.parent / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as output:
        code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    wall = round(time.perf_counter() - started, 1)
    if code != 0:
        return {"error": f"run.py exited with {code} after {wall} s; see {log}", "wall_seconds": wall}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    held_out = [(r["step"], r["val/success_rate"]) for r in records if r.get("val/success_rate") is not None]
    if not held_out or held_out[-1][0] != steps:
        return {"error": f"no validation after step {steps} in {run_dir / 'metrics.jsonl'}", "wall_seconds": wall}
    reward = [r["val/reward/mean"] for r in records if r.get("val/reward/mean") is not None]
    return {"initial_accuracy": held_out[0][1], "final_accuracy": held_out[-1][1],
            "initial_reward": reward[0], "final_reward": reward[-1], "wall_seconds": wall,
            "train_reward": [r["reward/mean"] for r in records if "reward/mean" in r]}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(load, 2) for load in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny://default")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="accuracy: GRPO steps of each run")
    parser.add_argument("--work-dir", type=Path, default=None, help="accuracy: data, the warmed-up model, runs")
    parser.add_argument("--only", choices=PARTS, default=None, help="run one part only")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine_before": machine()}
    if args.only in (None, "accuracy"):
        result |= accuracy(args)
        print(f"held-out accuracy after {args.steps} steps: separate {result['separate_final_accuracy']}, "
              f"shared {result['shared_final_accuracy']} (target: separate >= shared)")
    if args.only in (None, "speed"):
        result |= asyncio.run(measure(args))
        print(f"{args.model}, two rank-{args.rank} adapters, {args.rows} rows x {args.max_tokens} tokens: one adapter "
              f"{result['one_adapter_tokens_per_s']:.0f} tokens/s, mixed {result['mixed_tokens_per_s']:.0f} tokens/s, "
              f"ratio {result['mixed_batch_tokens_per_s_ratio']:.2f} (target >= 0.8; per round "
              f"{', '.join(f'{r:.2f}' for r in result['mixed_batch_tokens_per_s_ratios'])})")
    result["machine_after"] = machine()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
