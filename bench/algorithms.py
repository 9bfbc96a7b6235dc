"""The objectives side by side on the quickstart: every estimator, every policy loss and the extra
objectives train the same warmed-up model for the same number of steps.

    python bench/algorithms.py --json /tmp/algorithms.json            # all, 8 steps each
    python bench/algorithms.py --steps 6 --only grpo,distillation,rloo # a subset

The start model is the quickstart's supervised warm-up (examples/quickstart), run once and cached
in `--cache` (its run takes one RL step at learning rate 1e-30, which changes nothing, so that the
checkpoint is written); every objective starts from that checkpoint with the quickstart's settings
(16 tasks x 8 episodes per step, learning rate 1e-4, seed 1) and validates greedily on `--val-tasks`
held-out problems at the end. The held-out accuracy before RL is measured once (greedy decoding of
one model: the same for every objective).

`distillation` distils the warmed-up model, for `--steps` steps at learning rate 3e-4, from a GRPO
teacher trained `--teacher-steps` steps (default: `--steps`, the `grpo` row's own model; another
count trains one here): `fraction_of_teacher` is its held-out accuracy over the teacher's. At the
quickstart's 1e-4 the student moved too little in 8 steps: the 8-step teacher's 100 % held-out is
greedy decoding on a near tie (it calls the calculator with p = 0.56 on a problem's first token,
the student 0.27), and the student reached 0.45, still below the tie (0 % held-out); at 3e-4 it
reached 0.65 (100 %). docs/local.md, "Objectives compared", has the runs.

JSON: {"results": {name: {"initial_accuracy", "final_accuracy", "steps", "seconds"}}, "workload": ...};
`seconds` is the training run's wall time (validation included). Targets (issue 37): every RL
estimator and loss gains >= 30 points held-out; distillation reaches >= 90 % of the teacher's
accuracy; dynamic sampling trains only groups with reward spread, at a constant batch size
(`trained_groups_with_spread`, `trained_groups_per_step`).
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

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"

# name -> overrides of the quickstart config
OBJECTIVES: dict[str, list[str]] = {
    "grpo": [],
    "distillation": ["algorithm.policy_loss=distillation", "trainer.learning_rate=3e-4"],  # + the teacher
    "grpo_drop_zero_variance": ["algorithm.zero_variance_groups=drop"],
    "dynamic_sampling": ["algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.max_retries=4"],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "cispo": ["algorithm.policy_loss=cispo", "algorithm.clip_ratio_high=0.28"],
    "gspo": ["algorithm.policy_loss=gspo", "algorithm.clip_ratio_low=0.0003", "algorithm.clip_ratio_high=0.0004"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "dr_grpo": ["algorithm.adv_estimator=dr_grpo"],
    "rejection_sampling": ["algorithm.adv_estimator=rejection_sampling", "algorithm.policy_loss=cross_entropy"],
    "turn_grpo": ["algorithm.adv_estimator=turn_grpo"],
}


def agenttune(run_dir: Path, *overrides: str) -> float:
    """Run `agenttune train` on the quickstart config; returns its wall time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(QUICKSTART), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agenttune", "train", "--conf", str(QUICKSTART / "quickstart.yaml"),
                    "--run-dir", str(run_dir), *overrides, "local.plot=false", "monitor.tensorboard=false"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def warmed_up_model(cache: Path, data: Path) -> Path:
    """The quickstart's warmed-up model, from the cache or made once."""
    model = cache / "warmup" / "checkpoints" / "step_000001" / "model"
    if model.is_dir():
        print(f"warmed-up model from the cache: {model}", flush=True)
        return model
    print(f"supervised warm-up (once, cached in {cache}) ...", flush=True)
    seconds = agenttune(cache / "warmup", f"task_reader.path={data}/{{split}}.jsonl",
                        f"local.warmup.data={data / 'demos.jsonl'}", "trainer.total_steps=1", "trainer.save_freq=1",
                        "trainer.learning_rate=1e-30", "trainer.val_before_train=false", "trainer.test_freq=0")
    print(f"warm-up done in {seconds:.0f} s", flush=True)
    return model


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(records: list[dict], initial: float | None, seconds: float) -> dict:
    steps = [record for record in records if record.get("step", 0) > 0]
    accuracy = [record["val/success_rate"] for record in records if "val/success_rate" in record]
    if initial is None and records and records[0].get("step") == 0:
        initial = records[0].get("val/success_rate")
    result = {"initial_accuracy": initial, "final_accuracy": accuracy[-1] if accuracy else None,
              "steps": len(steps), "seconds": round(seconds, 1)}
    if any("train/informative_groups" in record for record in steps):
        trained = [record["train/informative_groups"] for record in steps]
        result["trained_groups_per_step"] = trained
        result["rollout_rounds"] = [1 + record.get("train/dynamic_sampling_rounds", 0) for record in steps]
    result["trained_groups_with_spread"] = _groups_with_spread(steps)
    return result


def _groups_with_spread(steps: list[dict]) -> float | None:
    """Of the groups trained (dynamic sampling: the informative ones), the share with reward spread,
    from the trainer's own count of zero-variance groups among those it was given."""
    given = sum(record.get("train/groups", 0) for record in steps)
    flat = sum(record.get("train/zero_variance_groups", 0) for record in steps)
    return (given - flat) / given if given else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--val-tasks", type=int, default=100)
    parser.add_argument("--only", default=",".join(OBJECTIVES), help="comma-separated objectives")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "agenttune-bench-algorithms")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--teacher", type=Path, default=None,
                        help="distillation's teacher (default: trained here with grpo); with --teacher-accuracy")
    parser.add_argument("--teacher-steps", type=int, default=None,
                        help="GRPO steps of distillation's teacher (default: --steps)")
    parser.add_argument("--teacher-accuracy", type=float, default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(QUICKSTART))
    from run import write_data

    data = args.cache / "data"
    if not (data / "demos.jsonl").is_file():
        write_data(data)
    start_model = warmed_up_model(args.cache, data)
    work = Path(tempfile.mkdtemp(prefix="agenttune-algorithms-"))
    results: dict[str, dict] = {}
    initial = None
    common = [f"model.path={start_model}", "local.warmup.data=null", f"task_reader.path={data}/{{split}}.jsonl",
              f"data.val_batch_size={args.val_tasks}", "trainer.save_freq=0"]

    def train(run_dir: Path, steps: int, *overrides: str) -> dict:
        seconds = agenttune(run_dir, *overrides, *common, f"trainer.total_steps={steps}",
                            f"trainer.test_freq={steps}", f"trainer.val_before_train={initial is None}")
        return summarize(read_metrics(run_dir), initial, seconds)

    args.teacher_steps = args.teacher_steps or args.steps
    for name in args.only.split(","):
        extra = []
        if name == "distillation":
            teacher, teacher_accuracy = args.teacher, args.teacher_accuracy
            if teacher is None:  # GRPO's model: this run's when it trained as long, else one trained here
                source = "grpo" if args.teacher_steps == args.steps and "grpo" in results else "grpo_teacher"
                if source == "grpo_teacher":
                    results[source] = train(work / source, args.teacher_steps, *OBJECTIVES["grpo"])
                    initial = results[source]["initial_accuracy"]
                teacher = work / source / "checkpoints" / f"step_{args.teacher_steps:06d}" / "model"
                teacher_accuracy = results[source]["final_accuracy"]
            extra = [f"algorithm.policy_loss_options.teacher={teacher}"]
        results[name] = row = train(work / name, args.steps, *OBJECTIVES[name], *extra)
        if name == "distillation" and teacher_accuracy:
            row["teacher_accuracy"] = teacher_accuracy
            row["fraction_of_teacher"] = row["final_accuracy"] / teacher_accuracy
        initial = row["initial_accuracy"]
        print(f"{name:>30}: {row['initial_accuracy']:.1%} -> {row['final_accuracy']:.1%} held-out after "
              f"{row['steps']} steps ({row['seconds']:.0f} s)", flush=True)
        if args.json:  # written after every objective: a cut-short run keeps what it measured
            args.json.write_text(json.dumps({"results": results, "workload": {
                "steps": args.steps, "teacher_steps": args.teacher_steps, "val_tasks": args.val_tasks, "start_model": str(start_model)}}, indent=2))


if __name__ == "__main__":
    main()
