"""One local-backbone update with a group's prompt held once (`local.share_prompts`) against every sample whole.

    python bench/shared_prompts.py                       # the quickstart's shape: 16 groups x 8, 310-token prompts
    python bench/shared_prompts.py --prompt 1000 --groups 4 --json /tmp/shared.json

A step's samples as a GRPO step on an agent gets them: `--groups` tasks, `--repeat` samples each that share
the task's `--prompt`-token prompt (system prompt, tools, question) and answer with 15-70 tokens, some
with inserted tool output (untrained). The model is `--model` (default `tiny://default`, the quickstart's
0.7M-parameter Qwen2). Each configuration trains the same steps from the same weights, `--steps` times
after one warm-up step, on an OpenMP team of `--threads` (1 and 2 by default; `local.update_threads: 1`,
bench/update_threads.py compares the update's own threads); printed per configuration:
the median step time, the tokens the model ran on, and the ratio whole / shared. Both configurations end
with the same weights (the largest difference is printed: float summation order only).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_episodes(step: int, groups: int, repeat: int, prompt_tokens: int) -> list:
    from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
    from agenttune.workflow.task import Task

    rng = random.Random(step)
    episodes = []
    for group in range(groups):
        prompt = [rng.randrange(3, 700) for _ in range(prompt_tokens)]
        for index in range(repeat):
            length = rng.randint(15, 70)
            mask = [1] * length
            if rng.random() < 0.5:  # a tool's output inside the response: context, not trained
                start = rng.randint(5, length - 8)
                mask[start:start + 6] = [0] * 6
            sample = Sample(prompt_ids=prompt, response_ids=[rng.randrange(3, 700) for _ in range(length)],
                            loss_mask=mask, logprobs=[-1.0 if m else 0.0 for m in mask])
            episodes.append(Episode(episode_id=f"{step}-{group}-{index}", task=Task(task_id=f"{step}-{group}"),
                                    group_id=f"{step}-{group}", repeat_index=index, reward=rng.choice([0.0, 1.0]),
                                    status=EpisodeStatus.OK, samples=[sample]))
    return episodes


def measure(args: argparse.Namespace, share: bool, threads: int) -> dict:
    import torch

    from agenttune.backbones.local.policy import load_policy
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.registry.config_loading import load_config

    torch.set_num_threads(threads)
    config = load_config({"model": {"path": args.model}, "trainer": {"learning_rate": 1e-4},
                          "local": {"share_prompts": share, "micro_batch_tokens": args.micro_batch_tokens,
                                    "update_threads": 1}})  # one OpenMP team (bench/update_threads.py: threads)
    torch.manual_seed(0)
    model = load_policy(config, torch.device("cpu"))
    trainer = GRPOTrainer(model, config, pad_token_id=0, total_steps=args.steps + 1)
    shape = (args.groups, args.repeat, args.prompt)
    trainer.step(step_episodes(0, *shape))  # warm-up: allocator, kernels
    times, metrics = [], {}
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        metrics = trainer.step(step_episodes(step, *shape))
        times.append(time.perf_counter() - started)
    weights = {name: value.detach().clone() for name, value in model.named_parameters()}
    return {"share_prompts": share, "threads": threads, "step_s_median": statistics.median(times),
            "step_s": times, "tokens": metrics["train/tokens"], "model_tokens": metrics["train/model_tokens"],
            "micro_batches": metrics["train/micro_batches"], "weights": weights}


def add_step_shape(parser: argparse.ArgumentParser) -> None:
    """The model and the step's shape (bench/update_threads.py trains the same step)."""
    parser.add_argument("--model", default="tiny://default")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=310)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_shape(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    rows = []
    for threads in (int(value) for value in args.threads.split(",")):
        whole, shared = measure(args, False, threads), measure(args, True, threads)
        difference = max(float((shared["weights"][name] - value).abs().max())
                         for name, value in whole["weights"].items())
        ratio = whole["step_s_median"] / shared["step_s_median"]
        for row in (whole, shared):
            print(f"threads {threads}, share_prompts {str(row['share_prompts']).lower():>5}: "
                  f"{row['step_s_median']:.2f} s a step (median of {args.steps}), {row['model_tokens']:.0f} of "
                  f"{row['tokens']:.0f} tokens run, {row['micro_batches']:.0f} micro-batch(es)")
        print(f"threads {threads}: shared prompts {ratio:.2f}x faster; largest weight difference after "
              f"{args.steps + 1} steps {difference:.2e}", flush=True)
        rows += [{key: value for key, value in row.items() if key != "weights"} | {"speedup": ratio,
                 "max_weight_difference": difference} for row in (whole, shared)]
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "shape": vars(args) | {"json": str(args.json)},
                                         "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
