"""The taskset Trinity reads: the agenttune task reader's tasks, written as JSON lines.

Trinity's explorer reads its taskset itself (`datasets.load_dataset(path, split=...)` in each run),
so whatever reader the config names (file, huggingface, env_service, a plugin's) is read once, here,
and written to `<run_dir>/trinity/tasks/{train,validation}.jsonl`. Each row carries the whole `Task`
as one JSON string: task metadata differs from row to row, and a single string column keeps
Arrow from guessing (and losing) nested types. The Trinity workflow turns a row back into the
`Task` with `task_from_row`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agenttune.plugin_api import Components, Task, UserError

TASK_COLUMN = "agenttune_task"


def write_taskset(components: Components, split: str, path: Path, *, limit: int | None = None) -> int:
    """Write the tasks of `split` (the first `limit`) to `path` (JSON lines); return how many there were."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as file:
        for task in components.read_tasks(split, limit=limit):  # under task_reader.read_timeout
            row = {"task_id": task.task_id, TASK_COLUMN: task.model_dump_json()}
            file.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    if count == 0:
        reader = getattr(components.task_reader_cls, "name", "?")
        raise UserError(f"The task reader ({reader!r}) found no tasks in split {split!r}.",
                        hint="Check task_reader's settings and the split names (task_reader.train_split).")
    return count


def task_from_row(row: dict[str, Any]) -> Task:
    """The agenttune `Task` of one taskset row (Trinity's `Task.raw_task`)."""
    encoded = row.get(TASK_COLUMN) if isinstance(row, dict) else None
    if not isinstance(encoded, str):
        raise UserError(f"A Trinity task reached agenttune's workflow without the {TASK_COLUMN!r} column "
                        f"(got columns {sorted(row) if isinstance(row, dict) else type(row).__name__}).",
                        hint="The agenttune workflow runs on tasksets the trinity backbone writes; do not point "
                             "trinity.buffer.explorer_input.taskset.path at another dataset.")
    try:
        return Task.model_validate_json(encoded)
    except ValidationError as error:
        raise UserError(f"A taskset row does not hold a valid agenttune Task: {error}.") from error
