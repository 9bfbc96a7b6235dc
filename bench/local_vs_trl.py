"""agenttune's local backbone against TRL's GRPOTrainer: same tiny model, same task, same batch sizes.

    python bench/local_vs_trl.py                       # 8 prompts x 8 generations, 32 new tokens, 4 steps
    python bench/local_vs_trl.py --steps 6 --prompts 16
    python bench/local_vs_trl.py --device cuda --model 'tiny://q15?layers=28&hidden=1536&heads=12&kv_heads=2&intermediate=8960' \
        --prompts 16 --generations 8 --max-tokens 128 --json results.json   # the GPU figure (issue 20)

Both train the same model (`--model`, default `tiny://default`: a 0.7M-parameter Qwen2-architecture
model built on this machine; `tiny://NAME?layers=..&hidden=..` builds larger shapes with random weights)
with GRPO on the same single-turn prompts, on the same device (`--device cpu|cuda`; bf16 on CUDA), with
the same reward: a fixed pseudo-random function
of the completion text (so every group has a reward spread and both trainers do the full work).
agenttune's rollouts go through its real product path: the workflow's OpenAI client, the gateway,
the batching `hf` engine sharing the trained weights. TRL generates with `model.generate`.

Printed per trainer (the first step is a warm-up and is left out of the averages):
rollout tokens/s (generated tokens / generation time), training tokens/s (prompt + completion tokens
/ time of the policy update), wall time per step and, on CUDA, peak GPU memory; and the ratio
agenttune / TRL; then each trainer's rollout and update seconds per step, and where agenttune's
engine spent its rollout (`engine/*` metrics: decode steps, rows per step, ms per step, the share
replayed as CUDA graphs; on CUDA the allocator's retries per update). `--json PATH` writes them (with `rollout_tokens_per_s_ratio` and
`wall_time_per_step_ratio`, and `agenttune_engine`). `--lora R` trains a rank-R LoRA adapter on both sides,
`--gradient-checkpointing` turns it on for both; `--engine KEY=VALUE` sets an option of agenttune's
`hf` engine (e.g. `--engine lean_forward=false --engine cpu_threads=2`, the engine before the lean
forward pass and the one-thread decode); `--local KEY=VALUE` a local-backbone option (e.g. `--local update_path=padded`, the update before
issue 38); `--rollout KEY=VALUE` sets a rollout option (e.g.
`--rollout workflow_processes=2`: the workflows' SDK calls and the gateway in two worker processes). Needs `trl`
(`pip install 'agenttune[bench]'`). Other processes on the machine skew both sides alike; run it on a
quiet machine for numbers worth quoting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput  # noqa: E402

DEFAULT_MODEL = "tiny://default"


def reward_of(text: str) -> float:
    """Deterministic, spread-out rewards that ignore quality: this benchmark measures speed."""
    return (zlib.crc32(text.encode()) % 1000) / 1000


def prompts(count: int) -> list[str]:
    return [f"What is {17 * i + 3} + {29 * i + 5}?" for i in range(count)]


class SingleTurn(Workflow):
    async def execute(self, task, tuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        response = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.query}])
        return WorkflowOutput(metadata={"final_answer": response.choices[0].message.content or ""})


class TextHashJudge(Judge):
    def judge(self, judge_input) -> JudgeResult:
        return JudgeResult(reward=reward_of(judge_input.final_answer or ""))


# -- agenttune ---------------------------------------------------------------------------------------
def run_agenttune(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    import yaml

    from agenttune.entrypoints.train import train_from_config
    from agenttune.registry.config_loading import load_config

    data = workdir / "tasks.jsonl"
    data.write_text("".join(json.dumps({"query": q}) + "\n" for q in prompts(args.prompts * args.steps)))
    config = {
        "workflow": "local_vs_trl:SingleTurn",
        "judge": {"judge_protocol": "local_vs_trl:TextHashJudge"},
        "task_reader": {"type": "file", "path": str(data)},
        "model": {"path": args.model},
        "rollout": {"num_repeat": args.generations, "max_env_worker": args.prompts * args.generations,
                    "temperature": 1.0, "max_response_length_in_one_turn": args.max_tokens},
        "data": {"train_batch_size": args.prompts, "shuffle": False},
        "algorithm": {"kl_coef": 0.0, "loss_agg_mode": "token-mean"},
        "trainer": {"total_steps": args.steps, "learning_rate": 1e-5, "save_freq": args.steps, "seed": 0},
        "local": {"device": args.device, "micro_batch_tokens": 1 << 20, "plot": False, "lora_rank": args.lora,
                  "gradient_checkpointing": args.gradient_checkpointing},
        "monitor": {"tensorboard": False},
        "engine": {"type": "hf"},
    }
    _reset_peak_memory(args.device)
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    # --engine, --rollout and --local as the CLI's `key.path=value` overrides (parsed and checked by config_loader)
    overrides = ([f"engine.{option}" for option in args.engine] + [f"rollout.{option}" for option in args.rollout]
                 + [f"local.{option}" for option in args.local])
    run = train_from_config(load_config(path, overrides, backbone="local"), run_dir=workdir / "agenttune-run")
    records = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    peak = _peak_memory_gib(args.device)
    return [{
        "rollout_s": r["perf/rollout_time_s"],
        "generated_tokens": r["tokens/generated_total"],
        "train_s": r["perf/train_time_s"],
        "train_tokens": r["train/tokens"],
        "step_s": r["perf/step_time_s"],
        "alloc_retries": r.get("perf/cuda_alloc_retries", 0.0),
        "peak_gib": peak,
        **{key: value for key, value in r.items() if key.startswith("engine/")},
    } for r in records if r["step"] >= 1]


def _reset_peak_memory(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_memory_gib(device: str) -> float:
    if device != "cuda":
        return float("nan")
    import torch

    return torch.cuda.max_memory_allocated() / 2**30


# -- TRL ---------------------------------------------------------------------------------------------
def run_trl(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agenttune.components.engines.model_loading import resolve_model_path

    torch.manual_seed(0)
    _reset_peak_memory(args.device)
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    cuda = args.device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}]} for q in prompts(args.prompts * args.steps)])
    steps: list[dict[str, float]] = []
    current: dict[str, float] = {}
    original_generate = model.generate

    def timed_generate(*gen_args, **gen_kwargs):
        started = time.perf_counter()
        output = original_generate(*gen_args, **gen_kwargs)
        prompt = gen_kwargs.get("input_ids", gen_args[0] if gen_args else None)
        completion = output[:, prompt.shape[1]:]
        ends = torch.tensor(eos_ids, device=completion.device)
        finished = (completion == tokenizer.pad_token_id) | torch.isin(completion, ends)
        # generated tokens: up to and including the first end token of each row
        lengths = torch.where(finished.any(1), finished.int().argmax(1) + 1, torch.full_like(finished[:, 0], completion.shape[1], dtype=torch.long))
        prompt_tokens = gen_kwargs["attention_mask"].sum() if "attention_mask" in gen_kwargs else prompt.numel()
        current["rollout_s"] = current.get("rollout_s", 0.0) + time.perf_counter() - started
        current["generated_tokens"] = current.get("generated_tokens", 0.0) + float(lengths.sum())
        current["train_tokens"] = current.get("train_tokens", 0.0) + float(lengths.sum() + prompt_tokens)
        return output

    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    model.generate = timed_generate

    def trl_reward(completions, **_):
        return [reward_of(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            current.clear()
            current["started"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            step_s = time.perf_counter() - current.pop("started")
            steps.append({**current, "step_s": step_s, "train_s": step_s - current.get("rollout_s", 0.0)})

    config = GRPOConfig(
        output_dir=str(workdir / "trl-run"), per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations, max_completion_length=args.max_tokens, max_steps=args.steps,
        learning_rate=1e-5, beta=0.0, temperature=1.0, use_cpu=not cuda, report_to=[], logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0, gradient_accumulation_steps=1, loss_type="grpo",
        bf16=cuda, gradient_checkpointing=args.gradient_checkpointing,
    )
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()], peft_config=peft_config)
    trainer.train()
    peak = _peak_memory_gib(args.device)
    return [{**step, "peak_gib": peak} for step in steps]


# -- the table --------------------------------------------------------------------------------------
def engine_summary(steps: list[dict[str, float]]) -> dict[str, float]:
    """agenttune's engine over the measured steps: where its rollout time went (`engine/*` metrics)."""
    measured = steps[1:] or steps
    total = {key: sum(s.get(key, 0.0) for s in measured) for key in
             ("engine/decode_steps", "engine/rows_decoded", "engine/decode_s", "engine/graph_steps",
              "engine/graph_captures", "rollout_s")}
    decode_steps = total["engine/decode_steps"] or float("nan")
    return {
        "decode steps per step": total["engine/decode_steps"] / len(measured),
        "rows per decode step": total["engine/rows_decoded"] / decode_steps,
        "ms per decode step": 1000 * total["engine/decode_s"] / decode_steps,
        "share of decode steps replayed as CUDA graphs": total["engine/graph_steps"] / decode_steps,
        "CUDA graphs recorded per step": total["engine/graph_captures"] / len(measured),
        "share of the rollout time in batches": total["engine/decode_s"] / total["rollout_s"],
    }


def summarise(steps: list[dict[str, float]]) -> dict[str, float]:
    measured = steps[1:] or steps  # the first step pays one-off costs (threads, caches)
    return {
        "rollout tokens/s": sum(s["generated_tokens"] for s in measured) / sum(s["rollout_s"] for s in measured),
        "training tokens/s": sum(s["train_tokens"] for s in measured) / sum(s["train_s"] for s in measured),
        "wall time per step (s)": statistics.fmean(s["step_s"] for s in measured),
        "peak GPU memory (GiB)": measured[-1]["peak_gib"],
    }


JSON_KEYS = {"rollout tokens/s": "rollout_tokens_per_s", "training tokens/s": "training_tokens_per_s",
             "wall time per step (s)": "wall_time_per_step", "peak GPU memory (GiB)": "peak_gpu_memory_gib"}


def as_json(args: argparse.Namespace, ours: dict[str, float], theirs: dict[str, float]) -> dict:
    """The figures and their ratios (agenttune over TRL), NaN (no GPU) as null."""
    def number(value: float) -> float | None:
        return None if value != value else value

    result: dict = {"settings": vars(args), "agenttune": {}, "trl": {}}
    for metric, key in JSON_KEYS.items():
        result["agenttune"][key] = number(ours[metric])
        result["trl"][key] = number(theirs[metric])
        ratio = ours[metric] / theirs[metric] if theirs[metric] else float("nan")
        result[f"{key}_ratio"] = number(ratio)
    return result


def in_own_process(trainer, args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    """`trainer(args, workdir)` in a fresh process: what one trainer leaves behind in a process
    (threads, allocator and thread-pool state) must not time the other. Run one after the other in
    one process, TRL's rollouts measured 8-18 % slower after agenttune's run than alone."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as process:
        return process.submit(trainer, args, workdir).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (the GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=32, help="most new tokens per completion")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model path or tiny://NAME?layers=..&hidden=..")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the figures and ratios here")
    parser.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of agenttune's hf engine (repeatable), e.g. lean_forward=false")
    parser.add_argument("--rollout", action="append", default=[], metavar="KEY=VALUE",
                        help="a rollout option of agenttune's (repeatable), e.g. workflow_processes=2")
    parser.add_argument("--local", action="append", default=[], metavar="KEY=VALUE",
                        help="a local-backbone option of agenttune's (repeatable), e.g. update_path=padded")
    args = parser.parse_args()
    from agenttune.errors import UserError
    from agenttune.registry.config_loading import parse_override

    for option in args.engine + args.rollout + args.local:
        try:
            parse_override(option)
        except UserError as error:
            parser.error(str(error))
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        our_steps = in_own_process(run_agenttune, args, Path(tmp))
        ours, engine = summarise(our_steps), engine_summary(our_steps)
        their_steps = in_own_process(run_trl, args, Path(tmp))
        theirs = summarise(their_steps)
    table = Table(title=f"GRPO on {args.model}, {args.device}: {args.prompts} prompts x {args.generations} generations, "
                        f"<= {args.max_tokens} new tokens, {args.steps} steps (first left out)")
    for column in ("metric", "agenttune local", "TRL GRPOTrainer", "ratio agenttune/TRL"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric in ours:
        ratio = ours[metric] / theirs[metric] if theirs[metric] else float("nan")
        table.add_row(metric, f"{ours[metric]:,.2f}", f"{theirs[metric]:,.2f}", f"{ratio:.2f}x")
    Console().print(table)
    print("(tokens/s: higher is better; wall time per step: lower is better)")
    for name, steps in (("agenttune", our_steps), ("TRL", their_steps)):
        print(f"{name} per step, rollout / training seconds: " +
              ", ".join(f"{s['rollout_s']:.2f} / {s['train_s']:.2f}" for s in steps))
    if args.device == "cuda":
        print("agenttune per step, CUDA allocator retries in the update: " +
              ", ".join(f"{s['alloc_retries']:.0f}" for s in our_steps))
    print("agenttune's hf engine: " + ", ".join(f"{name} {value:,.2f}" for name, value in engine.items()))
    if args.json is not None:
        figures = {**as_json(args, ours, theirs), "agenttune_engine": engine}
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
