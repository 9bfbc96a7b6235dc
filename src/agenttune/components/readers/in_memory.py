"""The `in_memory` task reader: tasks from Python objects (a `datasets.Dataset`, a list of rows).

    task_reader:
      type: in_memory
      splits: {train: my_data:TRAIN_ROWS, test: my_data:TEST_ROWS}
      query_column: question

Each split names a Python object by reference: a `datasets.Dataset`, a list of dicts (any iterable of
mappings) or a list of `Task`s.
`agenttune.Trainer(train_dataset=dataset)` uses this reader for datasets built in memory: it keeps
them in `agenttune.config.in_process` and names them here. Rows map to Tasks with the same column options
as the `file` reader (see `agenttune.components.readers.columns`); `Task` objects are taken as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any, ClassVar

from pydantic import Field

from agenttune.components.readers.base import TaskReader
from agenttune.components.readers.columns import ColumnOptions, RowMapping
from agenttune.config.references import load_reference
from agenttune.errors import UserError
from agenttune.workflow.task import Task


class InMemoryTaskReaderOptions(ColumnOptions):
    splits: dict[str, str] = Field(
        description="Split name -> reference ('package.module:NAME') of a datasets.Dataset, a list of row "
        "mappings or a list of Tasks."
    )


class InMemoryTaskReader(TaskReader):
    """Reads tasks from Python objects named by reference."""

    reads_locally = True

    name: ClassVar[str] = "in_memory"
    Options: ClassVar[type[InMemoryTaskReaderOptions]] = InMemoryTaskReaderOptions
    options: InMemoryTaskReaderOptions

    def check(self, splits: list[str]) -> None:
        for split in splits:
            self.rows(split)

    def read(self, split: str) -> Iterator[Task]:
        rows = self.rows(split)
        where = f"the {split!r} data ({self.options.splits[split]})"
        column_names = getattr(rows, "column_names", None)  # a datasets.Dataset says before any row is read
        mapping = RowMapping(self.options, source=self.options.splits[split], key="task_reader")
        if column_names is not None:
            mapping.check_columns(column_names, where)
        return _tasks(rows, mapping, split, where)

    def rows(self, split: str) -> Iterable[Any]:
        """The object holding `split`; a UserError when it is missing or holds no rows."""
        if split not in self.options.splits:
            raise UserError(f"task_reader.splits names no data for split {split!r} "
                            f"(it has: {', '.join(self.options.splits) or 'none'}).",
                            hint=f"Add `{split}: package.module:NAME` under task_reader.splits, or change the split name.")
        reference = self.options.splits[split]
        rows = load_reference(reference, key=f"task_reader.splits.{split}")
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise UserError(f"task_reader.splits.{split}: {reference!r} is a {type(rows).__name__}, not a dataset.",
                            hint="Point it at a datasets.Dataset, a list of dicts (one per task) or a list of Tasks.")
        return rows


def _tasks(rows: Iterable[Any], mapping: RowMapping, split: str, where: str) -> Iterator[Task]:
    """Tasks as they are, mappings through the column mapping (which also rejects an empty split)."""
    iterator = iter(rows)
    first = next(iterator, None)
    if isinstance(first, Task):
        yield from _given_tasks(first, iterator, where)
        return
    yield from mapping.tasks(_mappings(first, iterator, where), split, where)


def _given_tasks(first: Task, rest: Iterator[Any], where: str) -> Iterator[Task]:
    seen: set[str] = set()
    for index, task in enumerate(chain([first], rest)):
        if not isinstance(task, Task):
            raise UserError(f"{where}: item {index + 1} is a {type(task).__name__}, but the first item is a Task.",
                            hint="Give a list of Tasks or a list of row mappings, not a mix.")
        if task.task_id in seen:
            raise UserError(f"{where}: task id {task.task_id!r} appears twice.", hint="Task ids must be unique within a split.")
        seen.add(task.task_id)
        yield task


def _mappings(first: Any, rest: Iterator[Any], where: str) -> Iterator[Mapping[str, Any]]:
    if first is None:
        return
    for index, row in enumerate(chain([first], rest)):
        if not isinstance(row, Mapping):
            raise UserError(f"{where}: row {index + 1} is a {type(row).__name__}, not a mapping of columns.",
                            hint="Each row must be a dict such as {'query': ..., 'ground_truth': ...}.")
        yield row
