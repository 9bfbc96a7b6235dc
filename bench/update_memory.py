"""Memory and speed of one local-backbone update: the padded path against the packed, chunked one.

    python bench/update_memory.py --json update_memory.json                 # CPU: 1k/4k/8k/16k tokens
    python bench/update_memory.py --lengths 1024 --json small.json          # a quick look
    python bench/update_memory.py --device cuda --shape layers=28,hidden=1536,heads=12,kv_heads=2,intermediate=8960 \\
        --dtype bfloat16 --lengths 4096,8192,16384 --json h100.json         # the ~1.3 B shape on a GPU
    python bench/update_memory.py --device cuda --find-longest ...          # double the length until it fails

The model is a randomly initialised Qwen2 with the real 151,936-token vocabulary and a tiny body
(`--shape`, default 2 layers of hidden 64): its memory and time are the update's own, dominated by the
logits. Each measurement is one `GRPOTrainer.step` (local.update_path padded or packed, a group of two
samples of N tokens each, one micro-batch each, 1/4 prompt and 3/4 trained response), run in its own
subprocess, so an out-of-memory kills only that measurement; its peak is the child's maximum resident
set size (`os.wait4`), plus torch's peak CUDA allocation on a GPU. Before the update the child scores
the samples without gradient (the old-policy pass) and records its log-probs, and the gradients of the
update (an optimizer step pre-hook); the parent compares the two paths on them.

Memory caution: the padded path at 8k tokens needs ~20 GB of host memory on CPU. A measurement whose
estimate (extrapolated from the shorter ones already measured, else ~6 float32 copies of the logits)
exceeds the memory available now minus `--margin-gb` is skipped and recorded with its estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 151_936
PATHS = ("padded", "packed")


# -- the child: one update --------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import psutil
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agenttune.backbones.local.batching import build_items
    from agenttune.backbones.local.logprobs import token_logprobs
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.registry.config_loading import load_config
    from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
    from agenttune.workflow.task import Task

    length, device = args.tokens, torch.device(args.device)
    shape = {key: int(value) for key, value in (part.split("=") for part in args.shape.split(","))}
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=max(length, 4096),
        tie_word_embeddings=True, dtype=args.dtype,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, args.dtype))  # built in its dtype, on its device: no fp32 copy
    with device:
        model = Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.config.use_cache = False
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if args.lora_rank:
            model.enable_input_require_grads()
    settings = load_config({
        "model": {"path": "tiny://bench", "max_model_len": 2 * length},
        "data": {"max_prompt_length": length, "max_response_length": length},
        "local": {"update_path": "padded" if args.path == "trl" else args.path, "micro_batch_tokens": length, "gradient_checkpointing": False,
                  "logits_chunk_tokens": args.chunk_tokens},
        "trainer": {"learning_rate": 1e-4},
    })
    trainer = GRPOTrainer(model, settings, pad_token_id=0, total_steps=args.repeats)
    generator = torch.Generator().manual_seed(1)
    prompt = length // 4

    def sample() -> Sample:
        ids = torch.randint(3, args.vocab, (length,), generator=generator).tolist()
        return Sample(prompt_ids=ids[:prompt], response_ids=ids[prompt:], loss_mask=[1] * (length - prompt),
                      logprobs=[-1.0] * (length - prompt))

    episodes = [Episode(episode_id=f"e{index}", task=Task(task_id="t"), group_id="g", repeat_index=index,
                        reward=float(index), status=EpisodeStatus.OK, samples=[sample()]) for index in range(2)]
    out = Path(args.out)
    if args.compare:  # the old-policy scoring pass, kept to compare the paths
        items, _ = build_items(episodes, {"e0": -1.0, "e1": 1.0}, max_prompt_length=length, max_response_length=length)
        with torch.no_grad():
            scores = [token_logprobs(model, batch, temperature=0.7)[0] * batch.mask
                      for batch in trainer._micro_batches(items)]
        torch.save([score.cpu() for score in scores], out / "logprobs.pt")

        def keep_gradients(optimizer, *_):
            torch.save({name: p.grad.float().cpu() for name, p in model.named_parameters() if p.grad is not None},
                       out / "grads.pt")
            handle.remove()
        handle = trainer.optimizer.register_step_pre_hook(keep_gradients)
    baseline = psutil.Process().memory_info().rss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    update = (lambda: trl_update(model, trainer.optimizer, episodes)) if args.path == "trl" else (
        lambda: trainer.step(episodes))
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        metrics = update()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    assert metrics["train/updates"] == 1 and metrics["train/trained_tokens"] > 0
    result = {"seconds": min(times), "tokens_per_s": 2 * length / min(times), "baseline_rss_mb": baseline / 2**20}
    if device.type == "cuda":
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    (out / "result.json").write_text(json.dumps(result))


def trl_update(model, optimizer, episodes) -> dict[str, float]:
    """TRL's GRPOTrainer update, its log-prob side: the model's logits of the completion
    (`logits_to_keep`), divided by the temperature, `selective_log_softmax` and `entropy_from_logits`
    (trl.trainer.utils), one sample per micro-batch, then the same AdamW step. Not the whole trainer."""
    import torch
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    optimizer.zero_grad(set_to_none=True)
    trained = 0
    for advantage, episode in zip((-1.0, 1.0), episodes, strict=True):
        sample = episode.samples[0]
        device = next(model.parameters()).device
        input_ids = torch.tensor([sample.prompt_ids + sample.response_ids], device=device)
        keep = len(sample.response_ids)
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=keep + 1).logits[:, :-1] / 0.7
        logprobs = selective_log_softmax(logits, input_ids[:, -keep:])
        with torch.no_grad():
            entropy_from_logits(logits)
        (-advantage * logprobs.sum() / (2 * keep)).backward()
        trained += keep
        del logits, logprobs
    optimizer.step()
    return {"train/updates": 1.0, "train/trained_tokens": float(trained)}


# -- the parent: every (path, length) in a subprocess ----------------------------------------------
def measure(args: argparse.Namespace, path: str, length: int, directory: Path) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--child", "--path", path, "--tokens", str(length), "--out", str(directory),
               "--device", args.device, "--dtype", args.dtype, "--shape", args.shape, "--vocab", str(args.vocab),
               "--lora-rank", str(args.lora_rank), "--chunk-tokens", str(args.chunk_tokens),
               "--repeats", str(args.repeats)]
    command += ["--no-compare"] * (not args.compare) + ["--checkpointing"] * args.checkpointing
    with open(directory / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(command, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
    error = (directory / "stderr.txt").read_text()
    result: dict = {"peak_mb": usage.ru_maxrss / 1024}  # Linux: kilobytes
    if os.waitstatus_to_exitcode(status) != 0:
        result["failed"] = error.strip().splitlines()[-1] if error.strip() else f"exit status {status}"
        return result
    result.update(json.loads((directory / "result.json").read_text()))
    return result


def estimate_mb(done: dict[int, dict], length: int, vocab: int) -> float:
    """Extrapolated linearly from this path's measured lengths; with none, ~6 float32 logit copies."""
    points = sorted((n, r["peak_mb"]) for n, r in done.items() if "failed" not in r and "skipped" not in r)
    if len(points) >= 2:
        (n0, m0), (n1, m1) = points[-2], points[-1]
        return m1 + (length - n1) * (m1 - m0) / (n1 - n0)
    if points:
        return points[-1][1] * length / points[-1][0]
    return 6 * length * vocab * 4 / 2**20 + 1024


def compare(directories: dict[str, Path]) -> dict[str, float]:
    import torch

    old, new = (torch.load(directories[path] / "logprobs.pt") for path in PATHS)
    logprob_diff = max(float((a - b).abs().max()) for a, b in zip(old, new, strict=True))
    old_grads, new_grads = (torch.load(directories[path] / "grads.pt") for path in PATHS)
    grad_diff = max(float((old_grads[name] - new_grads[name]).abs().max() / old_grads[name].abs().max().clamp(min=1e-30))
                    for name in old_grads)
    return {"max_abs_logprob_diff": logprob_diff, "max_rel_grad_diff": grad_diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--lengths", default="1024,4096,8192,16384", help="tokens per sample")
    parser.add_argument("--paths", default="padded,packed",
                        help="padded, packed (local.update_path) and trl (TRL's log-prob path; needs trl)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shape", default="layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on (both paths)")
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="local.logits_chunk_tokens")
    parser.add_argument("--repeats", type=int, default=2, help="updates per measurement; the fastest is timed")
    parser.add_argument("--margin-gb", type=float, default=3.0, help="memory left free when deciding to skip")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="skip the log-prob and gradient comparison (saves memory on big models)")
    parser.add_argument("--find-longest", action="store_true",
                        help="per path, double the length from the first of --lengths until an update fails")
    parser.add_argument("--max-length", type=int, default=1 << 20, help="--find-longest stops doubling here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    report = run_all(args)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def run_all(args: argparse.Namespace) -> dict:
    import psutil

    lengths = [int(n) for n in args.lengths.split(",")]
    paths = args.paths.split(",")
    results: dict[str, dict[int, dict]] = {path: {} for path in paths}
    report: dict = {"device": args.device, "dtype": args.dtype, "shape": args.shape, "vocab": args.vocab,
                    "lora_rank": args.lora_rank, "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        if args.find_longest:
            report["longest_tokens"] = {path: find_longest(args, path, lengths[0], Path(scratch)) for path in paths}
            return report
        comparisons = []
        for length in lengths:
            for path in paths:
                needed = estimate_mb(results[path], length, args.vocab)
                available = psutil.virtual_memory().available / 2**20 - args.margin_gb * 1024
                if args.device == "cpu" and needed > available:
                    results[path][length] = {"skipped": f"estimated {needed:.0f} MB > {available:.0f} MB available",
                                             "estimate_mb": needed}
                    print(f"{path} {length}: skipped (~{needed:.0f} MB)", file=sys.stderr, flush=True)
                    continue
                results[path][length] = measure(args, path, length, Path(scratch) / f"{path}-{length}")
                print(f"{path} {length}: {results[path][length]}", file=sys.stderr, flush=True)
            done = {path: Path(scratch) / f"{path}-{length}" for path in PATHS}
            if args.compare and all((d / "grads.pt").exists() for d in done.values()):
                comparisons.append(compare(done))
    report["peak_mb"] = {path: {str(n): r.get("peak_mb") for n, r in rows.items()} for path, rows in results.items()}
    report["measurements"] = {path: {str(n): r for n, r in rows.items()} for path, rows in results.items()}
    report.update(ratios(results, lengths))
    skipped = results.get("padded", {}).get(8192, {})
    if "skipped" in skipped and "peak_mb" in results.get("packed", {}).get(8192, {}):
        # the padded path did not fit here: the ratio against its extrapolated need, labelled as such
        report["peak_ratio_8k_vs_padded_estimate"] = results["packed"][8192]["peak_mb"] / skipped["estimate_mb"]
    if comparisons:
        report["max_abs_logprob_diff"] = max(c["max_abs_logprob_diff"] for c in comparisons)
        report["max_rel_grad_diff"] = max(c["max_rel_grad_diff"] for c in comparisons)
    return report


def ratios(results: dict[str, dict[int, dict]], lengths: list[int]) -> dict:
    """new / old per length where both ran; the headline figures at 8k (or the longest both ran)."""
    key = "cuda_peak_mb" if any("cuda_peak_mb" in r for rows in results.values() for r in rows.values()) else "peak_mb"
    both = [n for n in lengths if all("seconds" in results.get(path, {}).get(n, {}) for path in PATHS)]
    peak = {str(n): results["packed"][n][key] / results["padded"][n][key] for n in both}
    speed = {str(n): results["packed"][n]["tokens_per_s"] / results["padded"][n]["tokens_per_s"] for n in both}
    headline = "8192" if "8192" in peak else (str(both[-1]) if both else None)
    return {
        "peak_ratio_by_length": peak, "tokens_per_s_ratio_by_length": speed, "peak_memory_measure": key,
        "peak_ratio_8k": peak.get("8192"), "tokens_per_s_ratio": speed.get(headline) if headline else None,
        "tokens_per_s_ratio_at": headline,
    }


def find_longest(args: argparse.Namespace, path: str, start: int, scratch: Path) -> dict:
    """Double the length until the update fails (out of memory); the last length that trained."""
    length, longest, failure = start, None, None
    while length <= args.max_length:
        result = measure(args, path, length, scratch / f"longest-{path}-{length}")
        print(f"{path} {length}: {result}", file=sys.stderr, flush=True)
        if "failed" in result:
            failure = result["failed"]
            break
        longest, length = length, 2 * length
    out_of_memory = failure is not None and "out of memory" in failure.lower()
    return {"tokens": longest, "first_failure_at": length if failure else None, "failure": failure,
            "out_of_memory": out_of_memory}


if __name__ == "__main__":
    main()
