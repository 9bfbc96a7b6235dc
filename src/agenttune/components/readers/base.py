"""Task readers turn a task source into `Task`s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from pydantic import BaseModel

from agenttune.config.base import Component
from agenttune.workflow.task import Task


class TaskReader(Component):
    """Reads the tasks of one split.

    A reader class has a unique `name` (the config's `task_reader.type`) and an `Options` pydantic model
    validated from the other keys of the `task_reader:` section. `read(split)` yields `Task`s with
    ids unique within the split. It raises `UserError` (never returns nothing silently) when the
    source is missing, a required column is absent, or the split is empty.

    agenttune calls `read` and `check` in a thread of their own (components/readers/deadline.py), so a reader that
    hangs cannot stall a run: past `task_reader.read_timeout` (600 s) without a next task, or without
    `check` returning, the run stops with an error naming the reader. `read` may also be an async
    generator (`async def read(...)` with `yield`): it runs on that thread's own event loop.
    """

    # True: reading every task is cheap and needs nothing running (local files, memory), so
    # `config check` and `train` read each split in full before the run starts.
    reads_locally: ClassVar[bool] = False

    def __init__(self, options: BaseModel | None = None):
        self.options = options if options is not None else self.Options()

    def check(self, splits: list[str]) -> None:
        """Fail early, with a UserError, when a split's source is plainly missing.

        Cheap checks only (no downloads, no reading every row): `agenttune train` calls this before any
        heavy work starts. The default checks nothing.
        """

    def endless(self, split: str) -> bool:
        """True when `read(split)` never ends (a procedural generator's stream).

        Backbones that list a split before training (`local`) then take only the tasks they need
        (`trainer.total_steps` batches; `data.val_batch_size` for validation) instead of reading forever.
        The default: every split ends.
        """
        return False

    def read(self, split: str) -> Iterator[Task]:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement read(split)")
