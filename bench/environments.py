"""Environments from the ecosystem, learned by a tiny model: held-out accuracy before and after RL.

    python bench/environments.py --json results.json                        # every environment
    python bench/environments.py --json results.json --only reasoning_gym   # some of them

Each environment is one entry of ENVIRONMENTS (name -> function running it): it writes its data, runs
`agenttune train --backbone local` on the tiny model (`tiny://default`) with a short supervised
warm-up first, as the quickstart does, and returns the held-out accuracy (greedy) of the validation
before RL and of the last one. An environment whose plugin is missing, or whose run fails, is reported
with its error instead of figures.

reasoning_gym: reasoning-gym's basic_arithmetic (3-digit products, examples/reasoning_gym/calculator.yaml)
with a calculator tool, judged by basic_arithmetic's own score_answer. The warm-up's demonstrations are
all right but only 30% use the calculator, so the warmed-up model mostly answers from "memory" (wrong);
RL has to find that the calculator pays.

verifiers: the verifiers 0.4 environment of examples/verifiers_env (`word-echo`: "Say WORD", rewarded for
saying it exactly) on 2,000 made-up training words and 100 held-out ones. The warm-up's replies all copy the
word, but only 30% say just the word ("Sure: WORD" otherwise); RL has to find that the plain word pays.

JSON: {"results": {name: {"initial_accuracy", "final_accuracy", "steps", "seconds_per_step",
"wall_seconds"} or {"error"}}, "machine": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ACCURACY = "val/success_rate"
TRAIN_METRIC = "reward/mean"  # a metric only a training step writes, to time the steps by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="Where to write the results.")
    parser.add_argument("--only", default=",".join(ENVIRONMENTS), help="Comma-separated environments to run.")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per environment.")
    parser.add_argument("--work-dir", type=Path, default=None, help="Data and run directories.")
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(ENVIRONMENTS))
    if unknown:
        parser.error(f"--only: unknown environment(s) {', '.join(unknown)}; choose from {', '.join(ENVIRONMENTS)}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="environments-"))
    results = {}
    for name in only:
        try:
            results[name] = ENVIRONMENTS[name](work / name, args)
        except Exception as error:  # one environment's failure is its entry, not the end of the bench
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        print(name, json.dumps(results[name]), flush=True)
    args.json.write_text(json.dumps({"results": results, "machine": machine()}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


# -- reasoning_gym ---------------------------------------------------------------------------------------------
RG_EXAMPLE = EXAMPLES / "reasoning_gym"
RG_DEMO_CONVERSATIONS, RG_PROBLEMS_PER_CONVERSATION, RG_TOOL_FRACTION = 4000, 6, 0.3


def reasoning_gym(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    conf = RG_EXAMPLE / "calculator.yaml"
    demos = work / "demos.jsonl"
    if not demos.exists():
        write_demos(conf, demos)
    return train_local(conf, work / "run", args.steps, [f"local.warmup.data={demos}"])


def write_demos(conf: Path, out: Path, seed: int = 3) -> None:
    """Warm-up conversations on questions of the config's generator that are not held out."""
    import yaml
    from agenttune_reasoning_gym.reader import ReasoningGymTaskReader

    sys.path.insert(0, str(RG_EXAMPLE))
    from calculator_agent import demonstration

    options = yaml.safe_load(conf.read_text(encoding="utf-8"))["task_reader"]
    held_out = {name: size for name, size in options["splits"].items() if size is not None}
    # The first split never repeats a question of the others: the demos skip the held-out ones.
    reader = ReasoningGymTaskReader(ReasoningGymTaskReader.Options(
        dataset=options["dataset"], config=options["config"], seed=options["seed"],
        splits={"demos": None, **held_out}))
    count = RG_DEMO_CONVERSATIONS * RG_PROBLEMS_PER_CONVERSATION
    rows = [{"question": task.query, "answer": task.metadata["ground_truth"]}
            for task in islice(reader.read("demos"), count)]
    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as file:
        for start in range(0, count, RG_PROBLEMS_PER_CONVERSATION):
            chunk = rows[start:start + RG_PROBLEMS_PER_CONVERSATION]
            use_tool = [rng.random() < RG_TOOL_FRACTION for _ in chunk]
            file.write(json.dumps(demonstration(chunk, use_tool=use_tool)) + "\n")


# -- verifiers ------------------------------------------------------------------------------------------------
VF_EXAMPLE = EXAMPLES / "verifiers_env"
VF_TRAIN_WORDS, VF_TEST_WORDS, VF_DEMO_CONVERSATIONS, VF_WORDS_PER_CONVERSATION, VF_PLAIN_FRACTION = 2000, 100, 8000, 6, 0.3


def verifiers(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """word-echo on made-up words; the held-out ones are in neither the training split nor the warm-up."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(VF_EXAMPLE / "word_echo.py", work)  # the environment beside its YAML, as in the example
    demos = work / "demos.jsonl"
    write_echo_demos(demos, first_word=VF_TRAIN_WORDS + VF_TEST_WORDS)
    conf = yaml.safe_load((VF_EXAMPLE / "verifiers_env.yaml").read_text(encoding="utf-8"))
    conf["task_reader"].update(
        args={"made_up": True, "num_tasks": VF_TRAIN_WORDS},
        split_args={"test": {"made_up": True, "offset": VF_TRAIN_WORDS, "num_tasks": VF_TEST_WORDS}})
    conf.update(  # the quickstart's GRPO settings, with half its tasks a step (an episode is a process: see the docs)
        rollout={"num_repeat": 8, "max_env_worker": 64, "temperature": 1.0, "val_temperature": 0.0,
                 "max_response_length_in_one_turn": 16},
        data={"train_batch_size": 8, "val_batch_size": VF_TEST_WORDS},
        trainer={"learning_rate": 1.0e-4, "save_freq": 0, "seed": 1},
        local={"device": "cpu", "plot": False,
               # 1,000 steps: after 400 the copies were often a letter off (docs/performance.md)
               "warmup": {"data": str(demos), "steps": 1000, "batch_size": 8, "learning_rate": 1.0e-3}})
    conf.pop("debug", None)
    (work / "word_echo.yaml").write_text(yaml.safe_dump(conf, sort_keys=False), encoding="utf-8")
    return train_local(work / "word_echo.yaml", work / "run", args.steps, [])


def write_echo_demos(out: Path, first_word: int, seed: int = 5) -> None:
    """Conversations of `Say WORD` requests, all answered with the word, but only 30% plainly: the others
    say `Sure: WORD`, which the environment's `exact` reward refuses (its `overlap` pays half). The warmed-up
    model copies words well and mostly adds the "Sure: "; RL has to find that the plain word is what pays."""
    sys.path.insert(0, str(VF_EXAMPLE))
    from word_echo import made_up_words

    words = made_up_words(first_word + VF_DEMO_CONVERSATIONS * VF_WORDS_PER_CONVERSATION)[first_word:]
    rng = random.Random(seed)
    with out.open("w", encoding="utf-8") as file:
        for start in range(0, len(words), VF_WORDS_PER_CONVERSATION):
            messages = []
            for word in words[start:start + VF_WORDS_PER_CONVERSATION]:
                reply = word if rng.random() < VF_PLAIN_FRACTION else f"Sure: {word}"
                messages += [{"role": "user", "content": f"Say {word}"}, {"role": "assistant", "content": reply}]
            file.write(json.dumps({"messages": messages}) + "\n")


# -- the table -------------------------------------------------------------------------------------------------
# name -> function(work_dir, args) -> result. Add an environment by adding an entry.
ENVIRONMENTS: dict[str, Callable[[Path, argparse.Namespace], dict[str, Any]]] = {
    "reasoning_gym": reasoning_gym,
    "verifiers": verifiers,
}


# -- shared ----------------------------------------------------------------------------------------------------
def train_local(conf: Path, run_dir: Path, steps: int, overrides: list[str]) -> dict[str, Any]:
    """`agenttune train --backbone local` (validating before RL and after `steps`), then its figures."""
    command = [sys.executable, "-m", "agenttune", "train", "--conf", str(conf), "--backbone", "local",
               "--run-dir", str(run_dir), f"trainer.total_steps={steps}", "trainer.val_before_train=true",
               f"trainer.test_freq={max(1, steps // 4)}",  # 4 validations after the one before RL
               *overrides]
    log = run_dir.parent / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as output:
        code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ).returncode
    wall = time.perf_counter() - started
    if code != 0:
        return {"error": f"agenttune train exited with {code} after {wall:.0f} s; see {log}"}
    return figures(run_dir / "metrics.jsonl", steps, wall)


def figures(metrics_file: Path, steps: int, wall: float) -> dict[str, Any]:
    records = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    accuracy = [(r["step"], r[ACCURACY]) for r in records if r.get(ACCURACY) is not None]
    trained = sorted(r["time"] for r in records if TRAIN_METRIC in r)
    if len(accuracy) < 2 or accuracy[-1][0] != steps or len(trained) < 2:
        return {"error": f"{metrics_file} has {len(accuracy)} validations and {len(trained)} training steps"}
    return {"initial_accuracy": accuracy[0][1], "final_accuracy": accuracy[-1][1], "steps": steps,
            "accuracy_by_step": dict(accuracy),
            "seconds_per_step": round((trained[-1] - trained[0]) / (len(trained) - 1), 2),
            "wall_seconds": round(wall, 1)}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0]}


if __name__ == "__main__":
    main()
