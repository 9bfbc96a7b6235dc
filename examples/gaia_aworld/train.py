"""Train the GAIA-style AWorld agent with AWorld Train's entry point, on agenttune.

    python examples/gaia_aworld/train.py                                  # tiny model, CPU, one step
    python examples/gaia_aworld/train.py --backbone debug                 # roll out and judge only
    python examples/gaia_aworld/train.py --config examples/gaia_aworld/gaia_aworld.yaml

The same four pieces as AWorld Train (agent, datasets, reward function, config), the same call. The
datasets are `datasets.Dataset` objects here; paths work too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gaia_agent, gaia_reward

from agenttune_aworld import AgentTrainer  # noqa: E402
from gaia_agent import build_agent  # noqa: E402
from gaia_reward import gaia_reward_func  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "gaia_aworld_smoke.yaml"), help="agenttune config file")
    parser.add_argument("--backbone", default=None, help="debug, local, verl, trinity (default: the config's)")
    parser.add_argument("--run-dir", default=None, help="run directory (default runs/<project>/<experiment>/<time>)")
    args = parser.parse_args()

    train = datasets.load_dataset("json", data_files=str(HERE / "data" / "train.jsonl"), split="train")
    test = datasets.load_dataset("json", data_files=str(HERE / "data" / "test.jsonl"), split="train")
    trainer = AgentTrainer(
        agent=build_agent,               # a function making a new Agent (an Agent instance works too)
        config=args.config,
        reward_func=gaia_reward_func,    # (data_source, solution_str, ground_truth, extra_info) -> float
        train_dataset=train,
        test_dataset=test,
        run_path=args.run_dir,
        train_engine_name=args.backbone,
    )
    run = trainer.train()
    print(f"run directory: {run.run_dir}")


if __name__ == "__main__":
    main()
