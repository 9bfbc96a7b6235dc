"""The `openenv` task reader: one task per reset seed, so each episode starts its own game.

    task_reader:
      type: openenv
      validation_split: validation
      train_size: 64            # tasks train-0 .. train-63, reset with seeds seed .. seed+63
      validation_size: 16       # validation-0 .. validation-15, seeds from validation_seed
      seed: 0
      validation_seed: 1000000
      reset: {difficulty: easy} # more keyword arguments for every reset (the environment's own)
      query: ""                 # an instruction put before the first observation by the text workflow
      capacity_wait: 300        # seconds an episode waits for a free session while the server is full

OpenEnv environments make their own episodes on `reset()`; a task here is just "reset with this
seed". Tasks from any other reader work too: put {"reset": {...}} (and optionally "url") in
`task.metadata["openenv"]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Task, TaskReader, UserError
from agenttune_openenv.session import METADATA_KEY


class OpenEnvReaderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_size: int = Field(default=64, ge=1, description="Number of training tasks (reset seeds).")
    validation_size: int = Field(default=16, ge=0, description="Number of validation tasks (0: none).")
    seed: int = Field(default=0, ge=0, description="Reset seed of the first training task.")
    validation_seed: int = Field(default=1_000_000, ge=0, description="Reset seed of the first validation task.")
    reset: dict[str, Any] = Field(default_factory=dict, description="More keyword arguments for every reset.")
    query: str = Field(default="", description="Instruction the text workflow puts before the first observation.")
    message_timeout: float = Field(default=60.0, gt=0, description="Seconds one reset, step or state may take.")
    capacity_wait: float = Field(default=300.0, ge=0, description="Seconds an episode waits for a free session "
                                                                  "while the server is full (max_concurrent_envs).")


class OpenEnvTaskReader(TaskReader):
    """Seeded tasks for an OpenEnv environment (the server is the openenv: section's)."""

    name: ClassVar[str] = "openenv"
    reads_locally = True  # nothing is fetched: preflight may read every split
    Options: ClassVar[type[BaseModel]] = OpenEnvReaderOptions
    options: OpenEnvReaderOptions

    def read(self, split: str) -> Iterator[Task]:
        options = self.options
        training = split.startswith("train")  # any other split name (validation, test, dev) is held out
        count, first = (options.train_size, options.seed) if training else \
            (options.validation_size, options.validation_seed)
        if count == 0:
            raise UserError(f"task_reader.validation_size is 0, but split {split!r} was asked for.",
                            hint="Set task_reader.validation_size, or unset task_reader.validation_split.")
        return iter([self._task(split, index, first + index) for index in range(count)])

    def _task(self, split: str, index: int, seed: int) -> Task:
        options = self.options
        spec = {"reset": {**options.reset, "seed": seed}, "message_timeout": options.message_timeout,
                "capacity_wait": options.capacity_wait}
        return Task(task_id=f"{split}-{index}", query=options.query, env_type="openenv",
                    metadata={METADATA_KEY: spec})
