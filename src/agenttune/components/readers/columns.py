"""Turning table rows into `Task`s: which column holds what, and presets for well-known datasets.

Both built-in readers (`file`, `huggingface`) share these options. A row becomes a Task like this:

    query         <- the query column (required)
    task_id       <- the id column, else `task_id` when the rows have one, else "<split>-<row number>"
    ground truth  <- metadata["ground_truth"], from the ground-truth column (optional), cut after
                     `ground_truth_after` when that is set (GSM8K: the number after "####")
    init_messages <- the messages column, when set
    metadata      <- every other column, under its own name (nothing is dropped)

A preset fills in the column options for a known dataset so its config needs only the path.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.errors import UserError
from agenttune.workflow.task import Task

# name -> the column options it stands for; a preset applies when its name is a component of the
# dataset path ("openai/gsm8k", "/data/openai/gsm8k/main") and no query column is configured.
PRESETS: dict[str, dict[str, str]] = {
    "gsm8k": {"query_column": "question", "ground_truth_column": "answer", "ground_truth_after": "####"},
}


class ColumnOptions(BaseModel):
    """Which columns of a row hold the query, the ground truth and the id."""

    model_config = ConfigDict(extra="forbid")

    query_column: str | None = Field(
        default=None, description="Column holding the query; default: the preset's, else `query`."
    )
    ground_truth_column: str | None = Field(
        default=None,
        description="Column holding the ground truth (stored as metadata.ground_truth); "
        "default: the preset's, else `ground_truth` when the rows have it.",
    )
    ground_truth_after: str | None = Field(
        default=None,
        description="Keep only the text after the last occurrence of this marker as the ground truth "
        "(GSM8K: '####'); the full value stays in metadata under the column's name.",
    )
    id_column: str | None = Field(
        default=None,
        description="Column holding a unique task id; default: `task_id` when the rows have it, "
        "else '<split>-<row number>'.",
    )
    messages_column: str | None = Field(
        default=None, description="Column holding a list of chat messages to start from (Task.init_messages)."
    )
    preset: Literal["auto", "none", "gsm8k"] = Field(
        default="auto",
        description="Column preset: auto picks one from the dataset path (e.g. '.../gsm8k') when "
        "query_column is not set; none disables presets.",
    )


class RowMapping:
    """The resolved column choices for one source, applied row by row."""

    def __init__(self, options: ColumnOptions, *, source: str, key: str):
        self.options = options
        self.source = source  # the dataset path, used to pick a preset and in messages
        self.key = key  # the config key of the reader, e.g. "task_reader"
        preset_name = self._preset_name()
        preset = PRESETS.get(preset_name, {}) if preset_name else {}
        self.query_column = options.query_column or preset.get("query_column", "query")
        self.ground_truth_column = options.ground_truth_column or preset.get("ground_truth_column")
        self.ground_truth_after = options.ground_truth_after or preset.get("ground_truth_after")

    def _preset_name(self) -> str | None:
        if self.options.preset == "none":
            return None
        if self.options.preset != "auto":
            return self.options.preset
        if self.options.query_column is not None:
            return None
        parts = PurePosixPath(self.source.replace("\\", "/").lower()).parts
        return next((name for name in PRESETS if name in parts), None)

    def check_columns(self, columns: Iterable[str], where: str) -> None:
        """Raise a UserError naming the missing configured column and the ones that exist."""
        columns = list(columns)
        wanted = [("query_column", self.query_column), ("ground_truth_column", self.ground_truth_column),
                  ("id_column", self.options.id_column), ("messages_column", self.options.messages_column)]
        for option, column in wanted:
            if column is not None and column not in columns:
                guess = difflib.get_close_matches(column, columns, n=1)
                suggestion = f" Did you mean {guess[0]!r}?" if guess else ""
                raise UserError(
                    f"{where} has no column {column!r} (set by {self.key}.{option}"
                    f"{'' if getattr(self.options, option) else ', the default'}). "
                    f"Its columns are: {', '.join(columns) or 'none'}.{suggestion}",
                    hint=f"Set {self.key}.{option} to the column that holds it.",
                )

    def tasks(self, rows: Iterable[Mapping[str, Any]], split: str, where: str) -> Iterator[Task]:
        """Convert rows to Tasks; a split without rows is an error, never silently empty."""
        seen: set[str] = set()
        count = 0
        for index, row in enumerate(rows):
            if index == 0:
                self.check_columns(row.keys(), where)
            task = self.task(row, split, index, where)
            if task.task_id in seen:
                raise UserError(f"{where}: task id {task.task_id!r} appears twice (row {index + 1}).",
                                hint=f"Task ids must be unique within a split; check {self.key}.id_column.")
            seen.add(task.task_id)
            count += 1
            yield task
        if count == 0:
            raise UserError(f"{where} has no rows for split {split!r}.",
                            hint=f"Check the data, or the split names ({self.key}.train_split / validation_split).")

    def task(self, row: Mapping[str, Any], split: str, index: int, where: str) -> Task:
        query = row.get(self.query_column)
        if query is None or (isinstance(query, str) and not query.strip()):
            raise UserError(f"{where}: row {index + 1} has an empty {self.query_column!r} (the query column).",
                            hint="Fix or remove that row.")
        used = {self.query_column}
        metadata = {key: value for key, value in row.items() if key not in used}
        if self.ground_truth_column is not None:
            metadata["ground_truth"] = self._ground_truth(row.get(self.ground_truth_column))
        elif "ground_truth" in row:
            metadata["ground_truth"] = row["ground_truth"]
        task_id = self._task_id(row, split, index)
        messages = row.get(self.options.messages_column) if self.options.messages_column else None
        if messages is not None and not _is_message_list(messages):
            raise UserError(f"{where}: row {index + 1}: column {self.options.messages_column!r} is not a list "
                            "of chat messages (objects with `role` and `content`).",
                            hint=f"Fix the data or unset {self.key}.messages_column.")
        return Task(task_id=task_id, query=str(query), init_messages=list(messages or []), metadata=metadata)

    def _task_id(self, row: Mapping[str, Any], split: str, index: int) -> str:
        column = self.options.id_column or ("task_id" if "task_id" in row else None)
        if column is not None and row.get(column) not in (None, ""):
            return str(row[column])
        return f"{split}-{index}"

    def _ground_truth(self, value: Any) -> Any:
        if self.ground_truth_after and isinstance(value, str) and self.ground_truth_after in value:
            return value.rsplit(self.ground_truth_after, 1)[1].strip()
        return value


def _is_message_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) and "role" in item for item in value)
