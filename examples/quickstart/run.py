"""The quickstart in one command (from the repository root):

    python examples/quickstart/run.py

1. writes the task files (2,000 training problems, 200 held-out ones) and the warm-up demonstrations
   into examples/quickstart/data/ — everything is generated here, nothing is downloaded;
2. runs `agenttune train --conf examples/quickstart/quickstart.yaml` (the local GRPO backbone on CPU):
   a short supervised warm-up, a validation pass, then RL, validating every 2 steps;
3. prints held-out accuracy before and after RL. The run directory holds metrics.jsonl, the rollout
   log, checkpoints, TensorBoard files and training_curves.png.

Extra arguments go to `agenttune train`, e.g. `--run-dir runs/qs trainer.total_steps=10`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE))

from arithmetic import demonstration, make_tasks  # noqa: E402

TRAIN_TASKS, VALIDATION_TASKS = 2000, 200
# The warm-up teaches the format. Its demonstrations are all correct, but only 30% of the answers use
# the calculator; the rest state the answer directly, which a tiny model cannot imitate on new problems.
TOOL_FRACTION = 0.3
DEMO_CONVERSATIONS, PROBLEMS_PER_CONVERSATION = 4000, 6


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_data(data: Path = DATA, seed: int = 0, *, conversations: int = DEMO_CONVERSATIONS) -> None:
    data.mkdir(parents=True, exist_ok=True)
    validation = make_tasks(VALIDATION_TASKS, seed=seed + 1)
    train = make_tasks(TRAIN_TASKS, seed=seed + 2, exclude={row["expression"] for row in validation})
    rng = random.Random(seed + 3)
    problems = make_tasks(conversations * PROBLEMS_PER_CONVERSATION, seed=seed + 4,
                          exclude={row["expression"] for row in validation})
    demos = [demonstration(problems[start:start + PROBLEMS_PER_CONVERSATION],
                           use_tool=[rng.random() < TOOL_FRACTION for _ in range(PROBLEMS_PER_CONVERSATION)])
             for start in range(0, len(problems), PROBLEMS_PER_CONVERSATION)]
    write_jsonl(data / "train.jsonl", train)
    write_jsonl(data / "validation.jsonl", validation)
    write_jsonl(data / "demos.jsonl", demos)


def before_and_after(run_dir: Path) -> tuple[float, float] | None:
    from agenttune.rollout.metrics import MetricsLog

    accuracy = [r["val/success_rate"] for r in MetricsLog(run_dir / "metrics.jsonl").read()
                if r.get("val/success_rate") is not None]
    return (accuracy[0], accuracy[-1]) if len(accuracy) >= 2 else None


def main(argv: list[str], data: Path = DATA, *, conversations: int = DEMO_CONVERSATIONS) -> Path:
    from agenttune.entrypoints.cli.main import main as agenttune

    write_data(data, conversations=conversations)
    run_dir = (Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv
               else Path("runs/quickstart") / time.strftime("%Y%m%d-%H%M%S"))
    if "--run-dir" not in argv:
        argv = ["--run-dir", str(run_dir), *argv]
    overrides = [f"task_reader.path={data}/{{split}}.jsonl", f"local.warmup.data={data / 'demos.jsonl'}"]
    try:
        agenttune(["train", "--conf", str(HERE / "quickstart.yaml"), *argv, *overrides])
    except SystemExit as exit_:
        if exit_.code:
            raise
    result = before_and_after(run_dir)
    if result:
        print(f"\nheld-out accuracy (greedy, {VALIDATION_TASKS} problems): "
              f"{result[0]:.1%} after the warm-up -> {result[1]:.1%} after RL")
    print(f"run directory: {run_dir} (curves: {run_dir / 'training_curves.png'})")
    return run_dir


if __name__ == "__main__":
    main(sys.argv[1:])
