"""The same training run through the `local`, `verl` and `trinity` backbones on this (CPU) machine.

    python bench/cluster_backbones.py --json results.json                      # every backbone installed here
    python bench/cluster_backbones.py --json local.json --only local,trinity   # some of them

The task is the quickstart's (examples/quickstart: a tiny model learns to use a calculator tool), started
where the quickstart's RL starts: after its supervised warm-up, done once here with agenttune's own
warm-up code and saved as a Hugging Face model that every backbone loads. Each backbone then trains
`--steps` GRPO steps from that model with the quickstart's task, seeds, group size and batch, and is
validated on the 200 held-out problems (greedy) before and after. What differs is the backbone's own:
`local` trains all weights (learning rate 1e-4, the quickstart's); `trinity` runs Trinity-RFT's own loop in
its Tinker mode against `agenttune tinker serve`, which trains a LoRA adapter (`--lora-learning-rate`);
`verl` runs verl's own trainer with its CPU switch (`verl.trainer.device=cpu`, plugins/verl/README.md; more
settings with `--verl-override`).

verl and Trinity-RFT need separate environments (their pins conflict): run the bench once in each with
`--only`, then read the JSON files side by side. A backbone whose plugin is missing, or whose run fails,
is reported with its error instead of figures.

JSON: {"results": {"local"|"verl"|"trinity": {"initial_accuracy", "final_accuracy", "steps",
"seconds_per_step"} or {"error"}}, "machine": {...}}
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"
BACKBONES = ("local", "verl", "trinity")
# The held-out accuracy each backbone's validation reports (greedy, the 200 problems).
ACCURACY = {"local": "val/success_rate", "verl": "val/success_rate",
            "trinity": "eval/agenttune_validation/success_rate/mean@1"}
# A metric only a training step writes, to time the steps by.
TRAIN_METRIC = {"local": "reward/mean", "verl": "reward/mean", "trinity": "actor/pg_loss"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="Where to write the results.")
    parser.add_argument("--only", default=",".join(BACKBONES), help="Comma-separated backbones to run.")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per backbone (the quickstart's 20).")
    parser.add_argument("--work-dir", type=Path, default=None, help="Data, the warmed-up model and run dirs.")
    parser.add_argument("--lora-learning-rate", type=float, default=1e-3, help="trinity (Tinker mode, LoRA).")
    parser.add_argument("--lora-rank", type=int, default=32, help="trinity (Tinker mode): LoRA rank.")
    parser.add_argument("--verl-override", action="append", default=[],
                        help="Extra KEY=VALUE for the verl run, repeatable.")
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(BACKBONES))
    if unknown:
        parser.error(f"--only: unknown backbone(s) {', '.join(unknown)}; choose from {', '.join(BACKBONES)}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="cluster-backbones-"))
    data = write_data(work / "data")
    model = warmed_up_model(work / "warm-model", data)
    results = {}
    for backbone in only:
        overrides = backbone_overrides(backbone, args)
        results[backbone] = run_backbone(backbone, work / "runs" / backbone, data, model, args.steps, overrides)
        print(backbone, json.dumps(results[backbone]), flush=True)
    args.json.write_text(json.dumps({"results": results, "machine": machine()}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


def write_data(data: Path) -> Path:
    sys.path.insert(0, str(QUICKSTART))
    from run import write_data as quickstart_data  # the quickstart's own generator: same tasks, same seeds

    if not (data / "validation.jsonl").exists():
        quickstart_data(data)
    return data


def warmed_up_model(out: Path, data: Path) -> Path:
    """The tiny model after the quickstart's warm-up (its settings, from quickstart.yaml), saved once."""
    if (out / "config.json").exists():
        return out
    import random

    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agenttune.backbones.local.warmup import warm_up_on_file
    from agenttune.components.engines.model_loading import resolve_model_path

    config = yaml.safe_load((QUICKSTART / "quickstart.yaml").read_text(encoding="utf-8"))
    warmup, seed = config["local"]["warmup"], config["trainer"]["seed"]
    path = resolve_model_path(config["model"]["path"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    random.seed(seed)
    torch.manual_seed(seed)
    started = time.perf_counter()
    warm_up_on_file(model, tokenizer, data / "demos.jsonl", steps=warmup["steps"], batch_size=warmup["batch_size"],
                    learning_rate=warmup["learning_rate"], micro_batch_tokens=config["local"]["micro_batch_tokens"],
                    seed=seed)
    print(f"warm-up: {warmup['steps']} steps in {time.perf_counter() - started:.0f} s", flush=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def backbone_overrides(backbone: str, args: argparse.Namespace) -> list[str]:
    if backbone == "trinity":
        # 4 workflow runners (each a Ray actor with its own gateway) instead of 16: 2 cores
        return ["trinity.model.tinker.enable=true", f"trinity.model.tinker.rank={args.lora_rank}",
                f"trainer.learning_rate={args.lora_learning_rate}", "rollout.max_env_worker=32"]
    if backbone == "verl":
        return ["verl.trainer.device=cpu", *args.verl_override]  # verl's own trainer on CPU (plugins/verl/README.md)
    return []


# Trinity-RFT's launcher stops the explorer 5 s after the trainer's last step, which cuts off a validation
# still running then (the 200 problems take longer on CPU): the trinity run trains this many steps more, so
# that the validation after step `--steps` completes; its figures are those of step `--steps`.
TRINITY_TAIL_STEPS = 2


def run_backbone(backbone: str, run_dir: Path, data: Path, model: Path, steps: int,
                 overrides: list[str]) -> dict[str, Any]:
    total = steps + (TRINITY_TAIL_STEPS if backbone == "trinity" else 0)
    command = [sys.executable, "-m", "agenttune", "train", "--conf", str(QUICKSTART / "quickstart.yaml"),
               "--backbone", backbone, "--run-dir", str(run_dir),
               f"model.path={model}", f"task_reader.path={data}/{{split}}.jsonl", "local.warmup.data=null",
               f"trainer.total_steps={total}", f"trainer.test_freq={steps}", "trainer.save_freq=0", *overrides]
    log = run_dir.parent / f"{backbone}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as output:
        code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ).returncode
    wall = time.perf_counter() - started
    if code != 0:
        return {"error": f"agenttune train exited with {code} after {wall:.0f} s; see {log}"}
    return figures(backbone, run_dir / "metrics.jsonl", steps, wall)


def figures(backbone: str, metrics_file: Path, steps: int, wall: float) -> dict[str, Any]:
    records = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    accuracy = [(r["step"], r[ACCURACY[backbone]]) for r in records
                if r.get(ACCURACY[backbone]) is not None and r["step"] <= steps]
    trained = sorted(r["time"] for r in records if TRAIN_METRIC[backbone] in r and r["step"] <= steps)
    if len(accuracy) < 2 or accuracy[-1][0] != steps or len(trained) < 2:
        return {"error": f"{metrics_file} has {len(accuracy)} validations and {len(trained)} training steps"}
    return {"initial_accuracy": accuracy[0][1], "final_accuracy": accuracy[-1][1], "steps": steps,
            # between the first and the last step's metrics: one validation pass falls inside, as in training
            "seconds_per_step": round((trained[-1] - trained[0]) / (len(trained) - 1), 2),
            "wall_seconds": round(wall, 1)}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0]}


if __name__ == "__main__":
    main()
