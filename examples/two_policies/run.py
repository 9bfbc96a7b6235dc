"""The two-policy example in one command (from the repository root):

    python examples/two_policies/run.py                   # two policies: a proposer and a checker adapter
    python examples/two_policies/run.py --one-policy      # the same run with one adapter shared by both agents

1. writes the quickstart's problems and warm-up demonstrations into examples/two_policies/data/, and
   as many again in the checker's format (team.py's `checker_demonstration`);
2. warms up tiny://default once with the quickstart's supervised warm-up (its settings, from
   quickstart.yaml, for WARMUP_STEPS steps: the proposer's format as often as in the quickstart, the
   checker's as well) and saves it as data/warm-model: the base model both adapters sit on (a run with
   several policies trains adapters only, so the warm-up is done before it, not inside it);
3. runs `agenttune train --conf examples/two_policies/two_policies.yaml` and prints held-out accuracy
   (greedy, 200 problems: the checker's final answer) before and after RL.

`--data DIR` puts the data and the warmed-up model elsewhere (default examples/two_policies/data). Other
arguments go to `agenttune train`, e.g. `--backbone debug`, `--run-dir runs/tp trainer.total_steps=4`.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "quickstart"
DATA = HERE / "data"
# Twice the quickstart's 400 steps: the demonstrations are half the proposer's, half the checker's.
WARMUP_STEPS = 800
# --one-policy: both agents mapped to one adapter with the same settings as each of the two. (A config
# file, not overrides: an override's mapping merges into the file's, which would keep both adapters.)
ONE_POLICY = {"adapters": {"team": {"rank": 32, "alpha": 64, "learning_rate": 1.0e-3}},
              "agents": {"proposer": "team", "checker": "team"}}


def quickstart_module(name: str):
    """A module of examples/quickstart by path (this file is run.py too, so `import run` would find itself)."""
    spec = importlib.util.spec_from_file_location(f"quickstart_{name}", QUICKSTART / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(QUICKSTART))
    spec.loader.exec_module(module)
    return module


def warmed_up_model(out: Path, data: Path, *, steps: int | None = None) -> Path:
    """tiny://default after the quickstart's warm-up (quickstart.yaml's settings; `steps` to shorten it), saved
    once: later runs reuse it."""
    if (out / "config.json").exists():
        return out
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agenttune.backbones.local.warmup import warm_up_on_file
    from agenttune.components.engines.model_loading import resolve_model_path

    config = yaml.safe_load((QUICKSTART / "quickstart.yaml").read_text(encoding="utf-8"))
    warmup, seed = config["local"]["warmup"], config["trainer"]["seed"]
    steps = WARMUP_STEPS if steps is None else steps
    path = resolve_model_path(config["model"]["path"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(seed)
    started = time.perf_counter()
    warm_up_on_file(model, tokenizer, data / "demos.jsonl", steps=steps, batch_size=warmup["batch_size"],
                    learning_rate=warmup["learning_rate"], micro_batch_tokens=config["local"]["micro_batch_tokens"],
                    seed=seed)
    print(f"warm-up: {steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prepare(data: Path = DATA, *, conversations: int | None = None, warmup_steps: int | None = None) -> Path:
    """The data files and the warmed-up base model; returns the model's directory."""
    quickstart = quickstart_module("run")
    if not (data / "demos.jsonl").exists():
        conversations = quickstart.DEMO_CONVERSATIONS if conversations is None else conversations
        quickstart.write_data(data, conversations=conversations)
        add_checker_demos(data / "demos.jsonl", quickstart, conversations)
    return warmed_up_model(data / "warm-model", data, steps=warmup_steps)


def add_checker_demos(demos: Path, quickstart, conversations: int, seed: int = 10) -> None:
    """As many conversations again in the checker's format, on new problems (none held out), after the
    proposer's: the warm-up samples its batches from the whole file."""
    sys.path.insert(0, str(HERE))
    from team import checker_demonstration

    held_out = {json.loads(line)["expression"] for line in (demos.parent / "validation.jsonl").open(encoding="utf-8")}
    per = quickstart.PROBLEMS_PER_CONVERSATION
    problems = quickstart.make_tasks(conversations * per, seed=seed, exclude=held_out)
    rng = random.Random(seed)
    with demos.open("a", encoding="utf-8") as file:
        for start in range(0, len(problems), per):
            demo = checker_demonstration(problems[start:start + per], rng, tool_fraction=quickstart.TOOL_FRACTION)
            file.write(json.dumps(demo) + "\n")


def one_policy_config() -> Path:
    """two_policies.yaml with ONE_POLICY as its policies, beside it (the workflow module is found there)."""
    import yaml

    config = yaml.safe_load((HERE / "two_policies.yaml").read_text(encoding="utf-8"))
    # per_agent: the shared adapter trains each agent's samples on its own reward, in groups of its own
    policies = {**ONE_POLICY, "reward": config["policies"].get("reward", "team")}
    path = HERE / "one_policy.generated.yaml"
    path.write_text(yaml.safe_dump({**config, "policies": policies}, sort_keys=False), encoding="utf-8")
    return path


def held_out_accuracy(run_dir: Path) -> list[tuple[int, float]]:
    from agenttune.rollout.metrics import MetricsLog

    return [(r["step"], r["val/success_rate"]) for r in MetricsLog(run_dir / "metrics.jsonl").read()
            if r.get("val/success_rate") is not None]


def main(argv: list[str], data: Path = DATA, *, conversations: int | None = None,
         warmup_steps: int | None = None) -> Path:
    from agenttune.entrypoints.cli.main import main as agenttune

    one_policy = "--one-policy" in argv
    argv = [arg for arg in argv if arg != "--one-policy"]
    model = prepare(data, conversations=conversations, warmup_steps=warmup_steps)
    run_dir = (Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv
               else Path("runs/two_policies") / time.strftime("%Y%m%d-%H%M%S"))
    if "--run-dir" not in argv:
        argv = ["--run-dir", str(run_dir), *argv]
    overrides = [f"task_reader.path={data}/{{split}}.jsonl", f"model.path={model}"]
    conf = one_policy_config() if one_policy else HERE / "two_policies.yaml"
    try:
        agenttune(["train", "--conf", str(conf), *argv, *overrides])
    except SystemExit as exit_:
        if exit_.code:
            raise
    accuracy = held_out_accuracy(run_dir)
    if len(accuracy) >= 2:
        print(f"\nheld-out accuracy (greedy, the checker's final answer): {accuracy[0][1]:.1%} before RL -> "
              f"{accuracy[-1][1]:.1%} after step {accuracy[-1][0]}")
    print(f"run directory: {run_dir}")
    return run_dir


def cli(argv: list[str]) -> None:
    if "--data" in argv:
        at = argv.index("--data")
        main(argv[:at] + argv[at + 2:], Path(argv[at + 1]).resolve())
    else:
        main(argv)


if __name__ == "__main__":
    cli(sys.argv[1:])
