"""Which tasks each step trains on: seeded, reshuffled every epoch, resumable from a position."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agenttune.workflow.task import Task


@dataclass
class TaskOrder:
    """Batches of `batch_size` tasks, epoch after epoch.

    The order of epoch `e` depends only on (seed, e), so the position (epoch, batch index) is all a
    checkpoint needs to continue with exactly the batches an uninterrupted run would have seen.
    A last batch smaller than `batch_size` is dropped (every step sees the same number of groups),
    unless the split is smaller than one batch.
    """

    tasks: Sequence[Task]
    batch_size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    index: int = 0  # batches already taken in this epoch

    @property
    def batches_per_epoch(self) -> int:
        return max(1, len(self.tasks) // self.batch_size)

    def next_batch(self) -> list[Task]:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        order = self._epoch_order(self.epoch)
        start = self.index * self.batch_size
        self.index += 1
        return [self.tasks[i] for i in order[start:start + self.batch_size]]

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
