"""Synchronous vs asynchronous training of the same agent on a long-tail workload, side by side.

    python bench/async_vs_sync.py                          # sync, one_step_off, async (staleness 2), 3 seeds each
    python bench/async_vs_sync.py --steps 20 --json /tmp/async.json
    python bench/async_vs_sync.py --seeds 1 --modes sync,async     # one quick pass

The agent is the quickstart's calculator agent (examples/quickstart) behind a slow environment:
every episode waits for its environment first — 0.05-0.15 s usually, but the tasks whose id hashes
into the slowest 10 % wait `--slow-s` seconds (3 s by default), as a slow tool or a long episode
would. A synchronous step waits for its slowest group; an asynchronous one trains on the groups
that are done while the slow ones finish.

All modes start from the same model: the quickstart's supervised warm-up (run once, first), then
`--steps` GRPO steps each, validating greedily on `--val-tasks` held-out problems every
`--test-freq` steps. Every mode runs once per seed in `--seeds` (3 by default), the modes interleaved
(sync, one_step_off, async, then the next seed), so that a drift in the machine's load touches
every mode alike. Each mode runs with its defaults: asynchronous modes weigh stale tokens by
token-level truncated importance sampling unless told otherwise (docs/local.md).

Printed per run: steps per second (training steps only: validation time is left out, though
asynchronous rollouts go on during it), the time to reach `--target` held-out accuracy and the final
accuracy; per mode: the median and spread (min-max) of steps/s over the seeds. The machine is printed
first and last: CPU model, cores, load average before and after (figures are comparable only from a
quiet machine: nothing else running). Target (issues 22, 39): the best asynchronous mode's median
steps/s >= 1.6x synchronous's, and every run of every mode ends >= 95 % held-out.

`--json PATH` writes the figures: `speedup` (the median steps/s of the best asynchronous mode over
synchronous's median), `final_accuracy` (mode -> its lowest final held-out accuracy over the seeds),
every run, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"

SLOW_AGENT = '''
import asyncio
import random
import zlib

from calculator_agent import CalculatorAgent


class SlowEnvironmentAgent(CalculatorAgent):
    """The calculator agent, after its environment is ready: usually fast, for some tasks very slow."""

    async def execute(self, task, tuner):
        slow = zlib.crc32(task.task_id.encode()) % 100 < {slow_percent}
        await asyncio.sleep({slow_s} if slow else 0.05 + 0.1 * random.random())
        return await super().execute(task, tuner)
'''

MODES = {
    "sync": ["trainer.mode=sync"],
    "one_step_off": ["trainer.mode=one_step_off"],
    "async": ["trainer.mode=async", "trainer.max_staleness=2"],
}


def agenttune(conf: Path, run_dir: Path, *overrides: str) -> float:
    """Run `agenttune train`; returns its wall time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(QUICKSTART), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agenttune", "train", "--conf", str(conf), "--run-dir", str(run_dir),
                    *overrides], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def warm_up(work: Path, data: Path) -> Path:
    """The quickstart's supervised warm-up and one RL step: the model every mode starts from."""
    run_dir = work / "warmup"
    agenttune(QUICKSTART / "quickstart.yaml", run_dir, f"task_reader.path={data}/{{split}}.jsonl",
              f"local.warmup.data={data / 'demos.jsonl'}", "trainer.total_steps=1", "trainer.save_freq=1",
              "trainer.val_before_train=false", "trainer.test_freq=0", "local.plot=false",
              "monitor.tensorboard=false")
    return run_dir / "checkpoints" / "step_000001" / "model"


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(records: list[dict], target: float) -> dict:
    steps = [record for record in records if record.get("step", 0) > 0]
    train_s = sum(record["perf/step_time_s"] for record in steps)
    elapsed, time_to_target = 0.0, None
    for record in steps:
        elapsed += record["perf/step_time_s"]
        if time_to_target is None and record.get("val/success_rate", -1) >= target:
            time_to_target = elapsed
    accuracy = [record["val/success_rate"] for record in steps if "val/success_rate" in record]
    return {"steps": len(steps), "train_s": train_s, "steps_per_s": len(steps) / train_s,
            "time_to_target_s": time_to_target, "final_accuracy": accuracy[-1] if accuracy else None,
            "dropped_groups": max((record.get("async/dropped_groups_total", 0) for record in steps), default=0),
            "staleness_mean": sum(record.get("async/staleness_mean", 0) for record in steps) / len(steps)}


def machine() -> dict:
    """What the figures were measured on: they compare only between quiet runs on one machine."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def by_mode(runs: list[dict]) -> dict[str, dict]:
    """Median and spread of steps/s over the seeds, and the lowest final accuracy, per mode."""
    summary: dict[str, dict] = {}
    for mode in dict.fromkeys(run["mode"] for run in runs):
        rates = [run["steps_per_s"] for run in runs if run["mode"] == mode]
        accuracies = [run["final_accuracy"] for run in runs if run["mode"] == mode]
        summary[mode] = {"steps_per_s_median": statistics.median(rates), "steps_per_s_min": min(rates),
                         "steps_per_s_max": max(rates), "runs": len(rates),
                         "final_accuracy_min": min((a for a in accuracies if a is not None), default=None)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--test-freq", type=int, default=4)
    parser.add_argument("--val-tasks", type=int, default=100)
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--slow-percent", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="1,2,3", help="one run of every mode per seed (trainer.seed)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    modes, seeds = args.modes.split(","), [int(seed) for seed in args.seeds.split(",")]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")

    sys.path.insert(0, str(QUICKSTART))
    from run import write_data

    host, load_before = machine(), load_average()
    print(f"machine: {host['cpu']}, {host['cores']} cores; load average before: {load_before}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="agenttune-async-bench-"))
    data = work / "data"
    write_data(data)
    (work / "slow_agent.py").write_text(SLOW_AGENT.format(slow_s=args.slow_s, slow_percent=args.slow_percent))
    conf = work / "slow.yaml"
    conf.write_text((QUICKSTART / "quickstart.yaml").read_text().replace(
        "calculator_agent:CalculatorAgent", "slow_agent:SlowEnvironmentAgent"))
    print(f"warm-up (once, shared by every mode) in {work} ...", flush=True)
    start_model = warm_up(work, data)

    runs = []
    for seed in seeds:
        for mode in modes:
            run_dir = work / f"{mode}-seed{seed}"
            wall = agenttune(conf, run_dir, *MODES[mode], f"trainer.seed={seed}", f"model.path={start_model}",
                             "local.warmup.data=null", f"task_reader.path={data}/{{split}}.jsonl",
                             f"trainer.total_steps={args.steps}", f"trainer.test_freq={args.test_freq}",
                             "trainer.val_before_train=false", f"data.val_batch_size={args.val_tasks}",
                             "trainer.save_freq=0", "local.plot=false", "monitor.tensorboard=false")
            row = {"mode": mode, "seed": seed} | summarize(read_metrics(run_dir), args.target) | {"wall_s": wall}
            runs.append(row)
            accuracy = "none" if row["final_accuracy"] is None else f"{row['final_accuracy']:.1%}"
            print(f"{mode:>13} seed {seed}: {row['steps_per_s']:.3f} steps/s ({row['train_s']:.1f} s for "
                  f"{row['steps']} steps), time to {args.target:.0%}: "
                  f"{row['time_to_target_s'] and round(row['time_to_target_s'], 1)} s, final accuracy {accuracy}, "
                  f"dropped groups {row['dropped_groups']:.0f}, mean staleness {row['staleness_mean']:.2f}",
                  flush=True)

    summary, load_after = by_mode(runs), load_average()
    for mode, row in summary.items():
        print(f"{mode:>13}: median {row['steps_per_s_median']:.3f} steps/s (spread {row['steps_per_s_min']:.3f}-"
              f"{row['steps_per_s_max']:.3f} over {row['runs']} seeds), lowest final accuracy "
              f"{row['final_accuracy_min']}")
    report = {"machine": host | {"load_average_before": load_before, "load_average_after": load_after},
              "workload": {"steps": args.steps, "slow_s": args.slow_s, "slow_percent": args.slow_percent,
                           "val_tasks": args.val_tasks, "target": args.target, "seeds": seeds},
              "modes": summary, "runs": runs,
              "final_accuracy": {mode: row["final_accuracy_min"] for mode, row in summary.items()}}
    if "sync" in summary:
        sync = summary["sync"]["steps_per_s_median"]
        others = {mode: row["steps_per_s_median"] / sync for mode, row in summary.items() if mode != "sync"}
        report["speedup_by_mode"] = others
        report["speedup"] = max(others.values()) if others else None
        for mode, ratio in others.items():
            print(f"{mode} / sync median steps per second: {ratio:.2f}x (target >= 1.6x)")
    print(f"machine: {host['cpu']}, {host['cores']} cores; load average before {load_before}, after {load_after}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
