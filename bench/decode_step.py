"""One decode step of the `hf` engine: transformers' forward pass against the lean one (engines/lean_decoder.py).

    python bench/decode_step.py                                   # tiny://default, 64 rows, CPU
    python bench/decode_step.py --model 'tiny://deep?layers=28&hidden=64&intermediate=128' --rows 1
    python bench/decode_step.py --device cuda --model 'tiny://q15?layers=28&hidden=1536&heads=12&kv_heads=2&intermediate=8960' --rows 128

Both paths run the same model object, the same left-padded prompts (`--prompt-tokens`, 1-in-8 rows
with 4 padding columns) and then `--steps` greedy decode steps, each fed the previous step's argmax,
exactly as the engine calls them (`HFEngine._prefill` / `_forward`, mask and positions included).
On CUDA a third path replays the decode steps as CUDA graphs (engines/cuda_graphs.py; its first
step at each batch size records the graph). Every path is fed the tokens transformers' path chose,
so the logits compare on the same inputs. Printed per path: the median wall time of a decode step
and of the prefill, its speed against transformers', and the largest logit difference (float32 on
CPU: ~1e-6; bf16 on CUDA: rounding). A deep, narrow model
at one row (`tiny://deep?layers=28&hidden=64...`, `--rows 1`) has almost no arithmetic: its step time
is the Python and launch overhead per step, which is what bounds a decode loop on a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time


def run(engine, prompts, steps: int, device: str, feed: list | None = None) -> tuple[list[float], float, list]:
    """Prefill `prompts`, then `steps` decode steps fed the argmax of each step's logits, or the
    tokens of `feed` (another run's logits), so that paths compare on the same inputs."""
    import torch

    from agenttune.components.engines.hf import _GrowingMask

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    synchronize()
    started = time.perf_counter()
    logits, cache, attention, positions = engine._prefill(prompts, engine.model.device)
    synchronize()
    prefill = time.perf_counter() - started
    mask, times, outputs = _GrowingMask(attention), [], [logits]
    for step in range(steps):
        attention = mask.extend()
        tokens = (feed[step] if feed is not None else logits).argmax(-1)[:, None]
        synchronize()
        started = time.perf_counter()
        logits = engine._decoder.forward(tokens, attention, positions, cache)
        synchronize()
        times.append(time.perf_counter() - started)
        positions = positions + 1
        outputs.append(logits)
    return times, prefill, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny://default")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU; default torch's)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from agenttune.components.engines.base import SamplingParams
    from agenttune.components.engines.hf import HFEngine, _Request
    from agenttune.components.engines.model_loading import load_tokenizer, resolve_model_path
    from agenttune.config.models import ModelConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    tokenizer = load_tokenizer(ModelConfig(path=args.model))
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = []
    for row in range(args.rows):
        length = args.prompt_tokens - (4 if row % 8 == 7 else 0)
        ids = torch.randint(1, vocab, (length,), generator=generator).tolist()
        prompts.append(_Request(ids, SamplingParams(max_tokens=args.steps), None, frozenset(), None))
    paths = {"transformers forward": dict(lean_forward=False), "lean forward": dict(cuda_graphs=False)}
    if args.device == "cuda":
        paths["lean, CUDA graphs"] = dict(cuda_graphs=True)
    results: dict = {}
    with torch.inference_mode():
        for _ in range(2):  # interleaved: the second round is the one reported
            for name, options in paths.items():
                engine = HFEngine(model, tokenizer, max_batch_size=max(args.rows, 1), **options)
                if name != "transformers forward" and not engine.uses_lean_forward:
                    raise SystemExit(f"{args.model}: the lean forward pass does not support this model")
                feed = results["transformers forward"][2] if name != "transformers forward" else None
                results[name] = run(engine, prompts, args.steps, args.device, feed)
    reference = results["transformers forward"]
    print(f"{args.model} on {args.device} ({dtype}), {args.rows} rows, {args.prompt_tokens}-token prompts, "
          f"{args.steps} decode steps (each path fed transformers' greedy tokens)")
    for name, (times, prefill, outputs) in results.items():
        difference = max(float((a - b).abs().max()) for a, b in zip(reference[2], outputs, strict=True))
        scale = max(float(a.abs().max()) for a in reference[2])
        print(f"  {name:>20}: decode step {1000 * statistics.median(times):8.3f} ms (median), "
              f"prefill {1000 * prefill:8.2f} ms, {statistics.median(reference[0]) / statistics.median(times):5.2f}x "
              f"transformers' speed; largest logit difference {difference:.2e} ({difference / scale:.1e} of the range)")


if __name__ == "__main__":
    main()
