"""One decode step of the `hf` engine: transformers' forward pass against the lean one (engines/lean_decoder.py).

    python bench/decode_step.py                                   # tiny://default, 64 rows, CPU
    python bench/decode_step.py --model 'tiny://deep?layers=28&hidden=64&intermediate=128' --rows 1
    python bench/decode_step.py --device cuda --model 'tiny://q15?layers=28&hidden=1536&heads=12&kv_heads=2&intermediate=8960' --rows 128

Both paths run the same model object, the same left-padded prompts (`--prompt-tokens`, 1-in-8 rows
with 4 padding columns) and then `--steps` greedy decode steps, each fed the previous step's argmax,
exactly as the engine calls them (`HFEngine._prefill` / `_forward`, mask and positions included).
Printed per path: the median wall time of a decode step and of the prefill, and the largest logit
difference between the paths (float32 on CPU: ~1e-6; bf16 on CUDA: rounding). A deep, narrow model
at one row (`tiny://deep?layers=28&hidden=64...`, `--rows 1`) has almost no arithmetic: its step time
is the Python and launch overhead per step, which is what bounds a decode loop on a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time


def run(engine, prompts, steps: int, device: str) -> tuple[list[float], float, list]:
    import torch

    from agenttune.engines.hf import _GrowingMask

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    synchronize()
    started = time.perf_counter()
    logits, cache, attention, positions = engine._prefill(prompts, engine.model.device)
    synchronize()
    prefill = time.perf_counter() - started
    mask, times, outputs = _GrowingMask(attention), [], [logits]
    for _ in range(steps):
        attention = mask.extend()
        tokens = logits.argmax(-1)[:, None]
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

    from agenttune.config import ModelConfig
    from agenttune.engines.base import SamplingParams
    from agenttune.engines.hf import HFEngine, _Request
    from agenttune.model_loading import load_tokenizer, resolve_model_path

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
    results = {}
    with torch.inference_mode():
        for lean in (False, True, False, True):  # interleaved: the second round is the one reported
            engine = HFEngine(model, tokenizer, lean_forward=lean)
            if lean and not engine.uses_lean_forward:
                raise SystemExit(f"{args.model}: the lean forward pass does not support this model")
            results[lean] = run(engine, prompts, args.steps, args.device)
    reference, lean = results[False], results[True]
    difference = max(float((a - b).abs().max()) for a, b in zip(reference[2], lean[2], strict=True))
    print(f"{args.model} on {args.device} ({dtype}), {args.rows} rows, {args.prompt_tokens}-token prompts, "
          f"{args.steps} decode steps")
    for name, (times, prefill, _) in (("transformers forward", reference), ("lean forward", lean)):
        print(f"  {name:>20}: decode step {1000 * statistics.median(times):8.3f} ms (median), "
              f"prefill {1000 * prefill:8.2f} ms")
    ratio = statistics.median(reference[0]) / statistics.median(lean[0])
    print(f"  lean is {ratio:.2f}x as fast per decode step; largest logit difference {difference:.2e}")


if __name__ == "__main__":
    main()
