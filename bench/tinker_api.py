"""What the Tinker-compatible server (`agenttune tinker serve`) costs over the same work done directly.

Side by side, in one run, on one model (default: the ~25 M tiny model below, built locally):

    training     forward_backward + optim_step (cross_entropy, one batch, LoRA rank 8) through the real
                 `tinker` SDK against the server on a loopback port, against the server's own Trainer
                 called in-process on the same training client with the same batch; interleaved repeats,
                 medians: api_overhead_ratio = API time / in-process time (target <= 1.10)
    sampling     generated tokens/s through the SDK (one sample request per prompt, num_samples each,
                 all in flight at once) against `agenttune serve` (the OpenAI-compatible server, its
                 own process, /v1/completions with the same prompt ids, one request per sample, all in
                 flight at once), same max tokens, temperature 1; interleaved repeats, medians:
                 sample_tokens_per_s_ratio = API / serve (target >= 0.9); also printed: the server's
                 own Sampler called in-process on the same prompts (all in flight at once, on the
                 server's event loop), to show where the API's time goes
    rl loop      tinker-cookbook's own RL loop (`rl.train.main`, rl_loop: "cookbook") on the even-tokens
                 task of agenttune/testing/cookbook_rl.py (nox -s tinker_cookbook runs it too): groups of 8
                 completions of up to 8 tokens, reward = the share of even token ids, importance_sampling,
                 one Adam step per iteration; initial reward = iteration 0's, final = the mean of the last 3
                 (target: rises by >= 0.3). Without tinker-cookbook installed (`--rl-loop sdk`, or not
                 importable): the same task in a loop written against the SDK alone (rl_loop: "sdk", ppo).

    python bench/tinker_api.py --json runs/tinker_api.json
    python bench/tinker_api.py --model tiny://default --repeats 3 --json /tmp/t.json     # a quick run

The Tinker server runs in a thread of this process (uvicorn, as the tests start it), so the SDK's
client threads and the server share this process; `agenttune serve` runs in a process of its own.
Every figure is printed with the machine's 1-minute load average before and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "tiny://mid?layers=8&hidden=512&heads=8&kv_heads=2&intermediate=1408"
API_KEY = "tml-bench"
RANK = 8


def load() -> float:
    return round(os.getloadavg()[0], 2)


def measured(name: str, figures: dict[str, Any], work: Any) -> Any:
    """Run `work()`, recording the load average before and after it under `name`."""
    before = load()
    value = work()
    figures[f"{name}_load_before"], figures[f"{name}_load_after"] = before, load()
    return value


# -- training: forward_backward + optim_step, API against in-process ----------------------------------
def training_batch(tokenizer: Any, batch: int, length: int) -> list[list[int]]:
    text = ("The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. " * 64)
    ids = tokenizer.encode(text)
    return [ids[i:i + length + 1] for i in range(batch)]


def training_step(client: Any, state: Any, sequences: list[list[int]], repeats: int) -> dict[str, Any]:
    import numpy as np
    from tinker import types

    from agenttune.entrypoints.tinker.protobuf import Datum

    sdk_data = [types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
                for ids in sequences]
    local_data = [Datum(ids[:-1], {"target_tokens": np.asarray(ids[1:], dtype=np.int64),
                                   "weights": np.ones(len(ids) - 1, dtype=np.float32)}) for ids in sequences]
    adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
    model_id = client.model_id

    def api() -> float:
        started = time.perf_counter()
        forward_backward = client.forward_backward(sdk_data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=1e-4))
        forward_backward.result(), optim.result()
        return time.perf_counter() - started

    def in_process() -> float:
        started = time.perf_counter()
        state.trainer.forward_backward(model_id, local_data, "cross_entropy", {}, forward_only=False)
        state.trainer.optim_step(model_id, adam)
        return time.perf_counter() - started

    api(), in_process()  # warm-up, not counted
    api_s, local_s = [], []
    for _ in range(repeats):
        api_s.append(api())
        local_s.append(in_process())
    api_median, local_median = statistics.median(api_s), statistics.median(local_s)
    return {"train_api_s": round(api_median, 4), "train_in_process_s": round(local_median, 4),
            "api_overhead_ratio": round(api_median / local_median, 3),
            "train_api_samples_s": [round(s, 4) for s in api_s],
            "train_in_process_samples_s": [round(s, 4) for s in local_s]}


# -- sampling: tokens/s through the SDK against agenttune serve -----------------------------------------
def sample_api(service: Any, prompts: list[list[int]], samples: int, max_tokens: int, seed: int) -> tuple[int, float]:
    from tinker import types

    sampler = service.create_sampling_client(base_model=SERVED_MODEL).result()
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
    started = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(prompt), samples, params) for prompt in prompts]
    tokens = sum(len(sequence.tokens) for future in futures for sequence in future.result().sequences)
    return tokens, time.perf_counter() - started


def sample_in_process(state: Any, prompts: list[list[int]], samples: int, max_tokens: int,
                      seed: int) -> tuple[int, float]:
    """The server's own Sampler called directly (no HTTP, no SDK), every prompt's request in flight at
    once as the API's are: where the API's sampling time goes. (On the server's event loop, which the
    engine batches on; the warm-up sampled through the API first.)"""
    session = state.sampler.open(None)

    async def run() -> int:
        replies = await asyncio.gather(*[
            state.sampler.sample(session.session_id, prompt, samples,
                                 {"max_tokens": max_tokens, "temperature": 1.0, "seed": seed}, prompt_logprobs=False)
            for prompt in prompts])
        return sum(len(sequence.tokens) for sampled in replies for sequence in sampled.sequences)

    started = time.perf_counter()
    tokens = asyncio.run_coroutine_threadsafe(run(), state.sampler.loop).result()
    return tokens, time.perf_counter() - started


def sample_serve(base_url: str, prompts: list[list[int]], samples: int, max_tokens: int,
                 seed: int) -> tuple[int, float]:
    import httpx

    async def run() -> tuple[int, float]:
        async with httpx.AsyncClient(timeout=600) as client:
            async def one(index: int, prompt: list[int]) -> int:
                reply = await client.post(f"{base_url}/completions", headers={"Authorization": f"Bearer bench-{index}"},
                                          json={"model": "any", "prompt": prompt, "max_tokens": max_tokens,
                                                "temperature": 1.0, "seed": seed + index})
                reply.raise_for_status()
                return int(reply.json()["usage"]["completion_tokens"])

            started = time.perf_counter()
            counts = await asyncio.gather(*[one(i, prompt) for i, prompt in
                                            enumerate(p for p in prompts for _ in range(samples))])
            return sum(counts), time.perf_counter() - started

    return asyncio.run(run())


def sampling(service: Any, state: Any, serve_url: str, prompts: list[list[int]], samples: int, max_tokens: int,
             repeats: int) -> dict[str, Any]:
    sample_api(service, prompts[:1], 1, 4, 0), sample_serve(serve_url, prompts[:1], 1, 4, 0)  # warm-up
    api_rates, serve_rates, api_tokens, serve_tokens, local_rates = [], [], [], [], []
    for repeat in range(repeats):
        tokens, seconds = sample_in_process(state, prompts, samples, max_tokens, repeat)
        local_rates.append(tokens / seconds)
        tokens, seconds = sample_api(service, prompts, samples, max_tokens, repeat)
        api_rates.append(tokens / seconds)
        api_tokens.append(tokens)
        tokens, seconds = sample_serve(serve_url, prompts, samples, max_tokens, repeat)
        serve_rates.append(tokens / seconds)
        serve_tokens.append(tokens)
    api_rate, serve_rate = statistics.median(api_rates), statistics.median(serve_rates)
    return {"sample_api_tokens_per_s": round(api_rate, 1), "sample_serve_tokens_per_s": round(serve_rate, 1),
            "sample_in_process_tokens_per_s": round(statistics.median(local_rates), 1),
            "sample_tokens_per_s_ratio": round(api_rate / serve_rate, 3),
            "sample_api_tokens": api_tokens, "sample_serve_tokens": serve_tokens}


# -- the RL loop -----------------------------------------------------------------------------------------
def cookbook_rl_loop(base_url: str, tokenizer: Any, steps: int, scratch: Path) -> dict[str, Any]:
    import numpy as np

    from agenttune.testing.cookbook_rl import offline_cookbook, run_rl_loop

    started = time.perf_counter()
    with offline_cookbook(SERVED_MODEL, lambda: tokenizer):
        rewards = run_rl_loop(base_url, scratch / "cookbook-rl", model=SERVED_MODEL, steps=steps,
                              learning_rate=3e-2, lora_rank=RANK)
    return {"rl_loop": "cookbook", "rl_steps": steps, "rl_rewards": [round(r, 3) for r in rewards],
            "cookbook_rl_initial_reward": round(rewards[0], 3),
            "cookbook_rl_final_reward": round(float(np.mean(rewards[-3:])), 3),
            "rl_seconds": round(time.perf_counter() - started, 1)}


def rl_loop(service: Any, tokenizer: Any, steps: int) -> dict[str, Any]:
    """The even-tokens task in a loop written against the SDK alone (where tinker-cookbook is not installed)."""
    import numpy as np
    from tinker import types

    client = service.create_lora_training_client(base_model=SERVED_MODEL, rank=RANK, seed=0).result()
    prompt = tokenizer.encode("Count:")
    rewards = []
    started = time.perf_counter()
    for step in range(steps):
        sampler = client.save_weights_and_get_sampling_client().result()
        sampled = sampler.sample(types.ModelInput.from_ints(prompt), 16,
                                 types.SamplingParams(max_tokens=8, stop=[], seed=step)).result().sequences
        reward = np.asarray([np.mean([token % 2 == 0 for token in s.tokens]) for s in sampled])
        rewards.append(float(reward.mean()))
        data = []
        for sequence, advantage in zip(sampled, reward - reward.mean(), strict=True):
            ids, context = prompt + sequence.tokens, len(prompt) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
                "target_tokens": ids[1:], "logprobs": [0.0] * context + list(sequence.logprobs),
                "advantages": [0.0] * context + [float(advantage)] * len(sequence.tokens)}))
        client.forward_backward(data, "ppo").result()
        client.optim_step(types.AdamParams(learning_rate=3e-2)).result()
    return {"rl_loop": "sdk", "rl_steps": steps, "rl_rewards": [round(r, 3) for r in rewards],
            "cookbook_rl_initial_reward": round(rewards[0], 3),
            "cookbook_rl_final_reward": round(float(np.mean(rewards[-3:])), 3),
            "rl_seconds": round(time.perf_counter() - started, 1)}


SERVED_MODEL = MODEL


def main() -> None:
    global SERVED_MODEL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each side (medians)")
    parser.add_argument("--batch", type=int, default=8, help="training datums per forward_backward")
    parser.add_argument("--length", type=int, default=128, help="tokens per training datum")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sample-repeats", type=int, default=3)
    parser.add_argument("--rl-steps", type=int, default=12)
    parser.add_argument("--rl-loop", choices=("cookbook", "sdk"), default=None,
                        help="default: tinker-cookbook's own loop where it is installed, else the SDK loop")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ.setdefault("TINKER_API_KEY", API_KEY)
    import tinker

    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.entrypoints.tinker.app import build_app
    from agenttune.entrypoints.tinker.server import LIMITS, build_state
    from agenttune.testing.gateways import serve_process
    from agenttune.testing.loopback import serve_app

    SERVED_MODEL = args.model
    started = time.perf_counter()
    figures: dict[str, Any] = {"model": args.model, "cpus": os.cpu_count(), "load_at_start": load(),
                               "repeats": args.repeats, "batch": args.batch, "length": args.length,
                               "lora_rank": RANK, "prompts": args.prompts, "samples_per_prompt": args.samples,
                               "max_tokens": args.max_tokens}
    torch_threads = None
    with tempfile.TemporaryDirectory(prefix="agenttune-bench-tinker-") as scratch:
        state = build_state(args.model, Path(scratch) / "state", device="cpu", poll_s=20.0)
        import torch

        torch_threads = torch.get_num_threads()
        figures["torch_threads"] = torch_threads
        with serve_app(build_app(state, limits=LIMITS)) as base_url:
            service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
            tokenizer = state.host.tokenizer
            client = service.create_lora_training_client(base_model=args.model, rank=RANK, seed=0).result()
            sequences = training_batch(tokenizer, args.batch, args.length)
            train = measured("train", figures, lambda: training_step(client, state, sequences, args.repeats))
            figures.update(train)
            print(f"training step   API {train['train_api_s'] * 1e3:8.1f} ms   in-process "
                  f"{train['train_in_process_s'] * 1e3:8.1f} ms   api_overhead_ratio {train['api_overhead_ratio']:.3f}"
                  f"   (target <= 1.10; load {figures['train_load_before']} -> {figures['train_load_after']})",
                  flush=True)

            prompts = [tokenizer.encode(text) for text in
                       ("The quick brown fox", "Once upon a time", "In the beginning", "Count: one two three",
                        "The weather today", "A list of fruits:", "Dear reader,", "Step 1:")][:args.prompts]
            path = resolve_model_path(args.model, key="--model")
            process, serve_url = serve_process("--model", args.model, "--run-dir", str(Path(scratch) / "serve"),
                                               f"rollout.max_response_length_in_one_turn={args.max_tokens}")
            figures["serve_model_path"] = str(path)
            try:
                sample = measured("sample", figures, lambda: sampling(service, state, serve_url, prompts, args.samples,
                                                                      args.max_tokens, args.sample_repeats))
            finally:
                process.terminate()
                process.wait(timeout=30)
            figures.update(sample)
            print(f"sampling        API {sample['sample_api_tokens_per_s']:8.1f} tok/s   serve "
                  f"{sample['sample_serve_tokens_per_s']:8.1f} tok/s   sample_tokens_per_s_ratio "
                  f"{sample['sample_tokens_per_s_ratio']:.3f}   (target >= 0.9; load {figures['sample_load_before']}"
                  f" -> {figures['sample_load_after']})", flush=True)
            print(f"                (the server's Sampler called in-process, no HTTP: "
                  f"{sample['sample_in_process_tokens_per_s']:.1f} tok/s)", flush=True)

            loop = args.rl_loop or ("cookbook" if importlib.util.find_spec("tinker_cookbook") else "sdk")
            if loop == "cookbook":
                rl = measured("rl", figures, lambda: cookbook_rl_loop(base_url, tokenizer, args.rl_steps, Path(scratch)))
            else:
                rl = measured("rl", figures, lambda: rl_loop(service, tokenizer, args.rl_steps))
            figures.update(rl)
            print(f"rl loop ({rl['rl_loop']})  reward {rl['cookbook_rl_initial_reward']:.3f} -> "
                  f"{rl['cookbook_rl_final_reward']:.3f}   (target: rises by >= 0.3; {rl['rl_steps']} steps, "
                  f"{rl['rl_seconds']} s; load {figures['rl_load_before']} -> {figures['rl_load_after']})", flush=True)
            service.close("success").result()
        state.futures.close()
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures["load_at_end"] = load()
    print(f"total {figures['seconds']} s on {figures['cpus']} CPUs (torch threads {torch_threads}); "
          f"load {figures['load_at_start']} -> {figures['load_at_end']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
