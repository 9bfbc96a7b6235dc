"""Tasks as the parquet rows verl's `RLHFDataset` loads.

One row per task:

    prompt          the task's first messages (role + text content), what verl's dataset shows as raw_prompt
    data_source     "agenttune/<task_reader.type>": verl groups validation metrics by it
    agent_name      "agenttune": the agent loop that runs the row
    reward_model    {"style": "agenttune", "ground_truth": <metadata.ground_truth as text>}
    extra_info      {"index", "split", "task_id", "task": <the Task as JSON>}

The agent loop rebuilds the exact `Task` from `extra_info.task`: nested metadata of any shape survives
(parquet needs one schema per column, so the task travels as a JSON string).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agenttune.plugin_api import Task, UserError
from agenttune_verl.translation import AGENT_LOOP_NAME


def task_row(task: Task, *, index: int, split: str, data_source: str) -> dict[str, Any]:
    return {
        "prompt": prompt_messages(task),
        "data_source": data_source,
        "agent_name": AGENT_LOOP_NAME,
        "reward_model": {"style": "agenttune", "ground_truth": _as_text(task.ground_truth)},
        "extra_info": {"index": index, "split": split, "task_id": task.task_id, "task": task.model_dump_json()},
    }


def prompt_messages(task: Task) -> list[dict[str, str]]:
    """The task's opening messages, with text content only (verl's dataset needs one schema)."""
    if task.init_messages:
        return [{"role": str(message.get("role", "user")), "content": _content_text(message.get("content"))}
                for message in task.init_messages]
    return [{"role": "user", "content": task.query}]


def task_from_row(extra_info: dict[str, Any]) -> Task:
    """The Task a row was written from (inverse of `task_row`)."""
    try:
        return Task.model_validate_json(extra_info["task"])
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(
            "A verl dataset row has no agenttune task in extra_info.task: the agenttune agent loop only runs "
            f"rows written by agenttune ({type(error).__name__}: {error}).",
            hint="Let `agenttune train --backbone verl` write the parquet files; do not point data.train_files "
                 "at other datasets.",
        ) from error


def write_tasks(tasks: Iterable[Task], path: Path, *, split: str, data_source: str) -> int:
    """Write the tasks to a parquet file; returns how many rows were written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [task_row(task, index=index, split=split, data_source=data_source) for index, task in enumerate(tasks)]
    if not rows:
        raise UserError(f"No tasks to write for split {split!r}.",
                        hint="Check task_reader's settings and the split names.")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return json.dumps(content, ensure_ascii=False)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
