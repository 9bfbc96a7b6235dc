"""A reasoning-gym generator whose score_answer sleeps or allocates, for the judge-limit tests.

Importing this module registers it with reasoning-gym (its public `register_dataset`): the tests name
it in `task_reader.imports`, as a user names a module of their own generators.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from random import Random
from typing import Any

from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS, register_dataset


@dataclass
class SleepyConfig:
    seed: int | None = None
    size: int = 500
    sleep_s: float = 0.0
    allocate_mb: int = 0


class SleepyDataset(ProceduralDataset):
    def __init__(self, config: SleepyConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        value = Random(self.seed + idx).randint(0, 10**9)
        return {"question": f"Repeat {value}.", "answer": str(value), "metadata": {"source_dataset": "sleepy"}}

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        time.sleep(self.config.sleep_s)
        hog = bytearray(self.config.allocate_mb * 1024 * 1024)
        for page in range(0, len(hog), 4096):  # touch every page: resident, not just reserved
            hog[page] = 1
        return 1.0 if answer == entry["answer"] else 0.0


if "sleepy" not in DATASETS:
    register_dataset("sleepy", SleepyDataset, SleepyConfig)

