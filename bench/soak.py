"""A chaos soak: a local GRPO run on the tiny model with faults in 40 % of its episodes, watched from outside.

    python bench/soak.py                                # 6 steps of 16 tasks x 4 (384 episodes)
    python bench/soak.py --steps 20 --json /tmp/soak.json

The run (a child process: `agenttune.testing.faults.SoakWorkflow` and `FaultyJudge`, SOAK_PLAN)
gets, in a fixed share of its episodes: workflows that raise, hang past `rollout.episode_timeout`
or drop their connection mid-stream; engine errors (every request, or the first one); judges that
raise, block their event loop, allocate without end, start a child in a new session and block,
or crash their process. This process samples the run's resident memory and open file descriptors
as each step is written, kills it if it runs past `--limit-s` (then `hung` is true), and looks for
processes left behind afterwards.

JSON keys (`--json PATH`): episodes_started (workflows started, from the run's journal),
episodes_accounted (episodes in the rollout log with a status: finished or failed by name),
lost (started but not accounted), statuses (count per status), unexpected_statuses (episodes whose
status is not the one their fault must turn into; unexpected_examples shows some), steps_completed, hung,
orphan_processes_after (processes a judge started, or children of the run, still alive after it),
rss_growth_mb_per_1k_episodes (from the end of the first step, the warm-up, to the last),
open_fds_growth (same span), wall_s. Targets (issue 34): lost 0, orphans 0, the run completes,
RSS growth < 50 MB per 1,000 episodes after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from agenttune.testing.faults import EXPECTED_STATUS

TINY = "tiny://soak?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
TASKS = 16
NUM_REPEAT = 4


def run_child(run_dir: Path, steps: int) -> None:
    """The soak run itself (in the child process); writes the journal's count at the end."""
    from agenttune.components.engines.hf import HFEngine
    from agenttune.entrypoints.train import train_from_config
    from agenttune.registry.config_loading import load_config
    from agenttune.testing.faults import JOURNAL, failing_generate

    HFEngine.generate = failing_generate(HFEngine.generate)  # type: ignore[method-assign]
    data = run_dir.parent / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps({"task_id": f"task-{index:02d}", "query": f"Tell me about {index}."})
                                              + "\n" for index in range(TASKS)))
    config = load_config({
        "project_name": "soak", "backbone": "local",
        "workflow": "agenttune.testing.faults:SoakWorkflow",
        "judge": {"judge_protocol": "agenttune.testing.faults:FaultyJudge", "timeout": 2, "workers": 4,
                  "memory_limit_mb": 256},
        "task_reader": {"type": "file", "path": str(data / "{split}.jsonl")},
        "model": {"path": TINY, "max_model_len": 256},
        "engine": {"type": "hf"},
        "rollout": {"num_repeat": NUM_REPEAT, "max_env_worker": 64, "episode_timeout": 5.0,
                    "max_response_length_in_one_turn": 8, "compute_madness_checklist": []},
        "data": {"train_batch_size": TASKS, "max_prompt_length": 128, "max_response_length": 64},
        "trainer": {"total_steps": steps, "save_freq": 0, "learning_rate": 1e-4},
        "local": {"device": "cpu", "plot": False, "keep_checkpoints": 1},
        "monitor": {"tensorboard": False},
    })
    train_from_config(config, run_dir=run_dir)
    (run_dir / "journal.json").write_text(json.dumps(JOURNAL.episodes))


def watch(run_dir: Path, steps: int, limit_s: float) -> dict:
    """Start the run in a child process, sample it at each step, and report."""
    from agenttune.rollout.process_tree import descendants, kill_tree
    from agenttune.testing.faults import orphans

    started = time.monotonic()
    child = subprocess.Popen([sys.executable, __file__, "--child", str(run_dir), "--steps", str(steps)],  # noqa: S603
                             stdout=subprocess.DEVNULL, stderr=open(run_dir.parent / "soak.log", "w"))  # noqa: SIM115
    process = psutil.Process(child.pid)
    samples: list[tuple[int, float, int]] = []  # (steps written, rss MB, open fds) at each new step
    metrics = run_dir / "metrics.jsonl"
    seen_children: set[int] = set()
    hung = False
    while child.poll() is None:
        if time.monotonic() - started > limit_s:
            hung = True
            kill_tree(child.pid)
            break
        try:
            seen_children.update(process.pid for process in descendants(child.pid))
            written = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            if written and (not samples or samples[-1][0] != written):
                samples.append((written, process.memory_info().rss / 2**20, process.num_fds()))
        except psutil.Error:
            pass
        time.sleep(0.2)
    time.sleep(1.0)  # what the run's end killed is gone by now
    left = [pid for pid in seen_children if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    return report(run_dir, samples, hung=hung, orphans=sorted(set(orphans()) | set(left)),
                  wall_s=time.monotonic() - started, exit_code=child.returncode)


def report(run_dir: Path, samples: list[tuple[int, float, int]], *, hung: bool, orphans: list[int],
           wall_s: float, exit_code: int | None) -> dict:
    journal = run_dir / "journal.json"
    started = json.loads(journal.read_text()) if journal.exists() else {}
    statuses: Counter[str] = Counter()
    accounted: set[str] = set()
    unexpected: dict[str, str] = {}  # episode -> "fault: status: error", where the status is not the fault's
    for path in sorted((run_dir / "rollouts").glob("step_*_train.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                statuses[record["status"]] += 1
                accounted.add(record["episode_id"])
                fault = started.get(record["episode_id"])
                if record["episode_id"] in started and record["status"] != EXPECTED_STATUS[fault]:
                    unexpected[record["episode_id"]] = f"{fault}: {record['status']}: {(record['error'] or '')[:160]}"
    per_step = TASKS * NUM_REPEAT
    growth_mb = growth_fds = None
    if len(samples) >= 2:
        (first_step, first_rss, first_fds), (last_step, last_rss, last_fds) = samples[0], samples[-1]
        growth_mb = (last_rss - first_rss) / ((last_step - first_step) * per_step) * 1000
        growth_fds = last_fds - first_fds
    return {
        "episodes_started": len(started), "episodes_accounted": len(accounted),
        "lost": len(set(started) - accounted), "statuses": dict(statuses),
        "unexpected_statuses": len(unexpected), "unexpected_examples": sorted(unexpected.values())[:5],
        "steps_completed": samples[-1][0] if samples else 0, "hung": hung,
        "orphan_processes_after": len(orphans), "rss_growth_mb_per_1k_episodes": growth_mb,
        "open_fds_growth": growth_fds, "rss_mb_by_step": [round(rss, 1) for _, rss, _ in samples],
        "wall_s": round(wall_s, 1), "exit_code": exit_code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--limit-s", type=float, default=600.0, help="Kill the run (hung) after this long.")
    parser.add_argument("--json", help="Write the report to this file.")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(Path(args.child), args.steps)
        return
    with tempfile.TemporaryDirectory(prefix="agenttune-soak-") as scratch:
        result = watch(Path(scratch) / "run", args.steps, args.limit_s)
        if result["exit_code"] != 0:
            print((Path(scratch) / "soak.log").read_text()[-3000:], file=sys.stderr)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
