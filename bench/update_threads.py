"""One local-backbone update on CPU: micro-batches on threads of their own vs one OpenMP team, alone and beside a busy thread.

    python bench/update_threads.py                  # the quickstart's step shape, 2 threads
    python bench/update_threads.py --threads 4 --json /tmp/update_threads.json

An asynchronous step updates while the engine's decode thread generates and the event loop runs the agents.
torch runs each op on an OpenMP team that ends at a barrier: a team member that another thread preempts holds
up the rest. `local.update_threads` instead runs whole micro-batches on threads with one intra-op thread each
(backbones/local/update_threads.py). Configurations, each training the same steps from the same weights:

- `openmp x1`: `update_threads: 1` on one intra-op thread (the asynchronous default before);
- `openmp xN`: `update_threads: 1` on an N-thread team;
- `threads xN`: `update_threads: N` (the default now), the step split into at least 4 micro-batches a thread.

Each runs alone, then beside a thread that computes as a decode thread does (small matrix products on one
intra-op thread, with short pauses). The step is bench/shared_prompts.py's: `--groups` tasks x `--repeat`
samples sharing a `--prompt`-token prompt, the quickstart's 0.7M-parameter model. Printed: the median step
time of each configuration and its ratio to `openmp x1` in the same setting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from shared_prompts import add_step_shape, step_episodes  # noqa: E402  (the same step)


class BusyThread:
    """A decode thread's load: small products on one intra-op thread, pausing 4 ms every ~40 ms."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch

        torch.set_num_threads(1)
        rows, weight = torch.randn(48, 128), torch.randn(128, 128) / 12
        while not self._stop.is_set():
            for _ in range(200):
                rows = torch.tanh(rows @ weight)
            time.sleep(0.004)

    def __enter__(self) -> BusyThread:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(args: argparse.Namespace, *, team: int, update_threads: int, busy: bool) -> float:
    """The median step time of one configuration."""
    import torch

    from agenttune.backbones.local.policy import load_policy
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.registry.config_loading import load_config

    torch.set_num_threads(team)
    config = load_config({"model": {"path": args.model}, "trainer": {"learning_rate": 1e-4},
                          "local": {"micro_batch_tokens": args.micro_batch_tokens, "update_threads": update_threads}})
    torch.manual_seed(0)
    trainer = GRPOTrainer(load_policy(config, torch.device("cpu")), config, pad_token_id=0,
                          total_steps=args.steps + 1)
    shape = (args.groups, args.repeat, args.prompt)
    trainer.step(step_episodes(0, *shape))  # warm-up: allocator, kernels
    times = []
    try:
        for step in range(1, args.steps + 1):
            episodes = step_episodes(step, *shape)
            with BusyThread() if busy else contextlib.nullcontext():
                started = time.perf_counter()
                trainer.step(episodes)
                times.append(time.perf_counter() - started)
    finally:
        trainer.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_shape(parser)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))

    configurations = {"openmp x1": (1, 1), f"openmp x{args.threads}": (args.threads, 1),
                      f"threads x{args.threads}": (args.threads, args.threads)}
    results: dict[str, dict[str, float]] = {}
    for setting, busy in (("alone", False), ("beside a busy thread", True)):
        for name, (team, update_threads) in configurations.items():
            results.setdefault(setting, {})[name] = measure(args, team=team, update_threads=update_threads, busy=busy)
        base = results[setting]["openmp x1"]
        for name, seconds in results[setting].items():
            print(f"{setting:>20}, {name:>11}: {seconds:.2f} s a step (median of {args.steps}), "
                  f"{base / seconds:.2f}x openmp x1", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"shape": vars(args) | {"json": str(args.json)}, "step_s": results}, indent=2))


if __name__ == "__main__":
    main()
