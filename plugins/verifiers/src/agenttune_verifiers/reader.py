"""The `verifiers` task reader: a verifiers environment's tasks, one agenttune Task each.

The Task's metadata carries the environment's config and the verifiers task's wire data, so the
workflow and the judge rebuild exactly this task, in any process. With verifiers 0.1-0.3 installed,
the environment's dataset rows instead (legacy/tasks.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel

from agenttune.plugin_api import Task, TaskReader, UserError
from agenttune_verifiers.legacy.tasks import read_legacy_tasks
from agenttune_verifiers.loading import load_env
from agenttune_verifiers.options import METADATA_KEY, VerifiersOptions
from agenttune_verifiers.stack import installed_stack


class VerifiersTaskReader(TaskReader):
    """Reads the tasks of a verifiers environment (its taskset) for one split."""

    name: ClassVar[str] = "verifiers"
    Options: ClassVar[type[BaseModel]] = VerifiersOptions
    options: VerifiersOptions

    def read(self, split: str) -> Iterator[Task]:
        if installed_stack() == "legacy":
            return iter(_nonempty(read_legacy_tasks(self.options, split), self.options.id, split))
        config = self.options.env_config(split)
        env = load_env(config)
        taskset = env.taskset
        if self.options.limit is not None:
            taskset = taskset.take(self.options.limit)
        elif not taskset.bounded:
            raise UserError(f"The verifiers taskset {self.options.id!r} is endless.",
                            hint="Set task_reader.limit to the number of tasks a split should have.")
        return iter(_nonempty([_to_task(vf_task, config) for vf_task in taskset], self.options.id, split))


def _nonempty(tasks: list[Task], env_id: str, split: str) -> list[Task]:
    if not tasks:
        raise UserError(f"The verifiers environment {env_id!r} has no tasks for split {split!r}.",
                        hint="Check task_reader.args and split_args.")
    return tasks


def _to_task(vf_task: Any, config: dict[str, Any]) -> Task:
    data = vf_task.data
    task_id = str(data.id) if data.id is not None else f"{data.idx}"
    return Task(task_id=task_id, query=data.prompt_text,
                metadata={METADATA_KEY: {"env": config, "task": data.model_dump(mode="json")}})
