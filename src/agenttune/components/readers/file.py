"""The `file` task reader: tasks from local JSONL, JSON or Parquet files.

    task_reader:
      type: file
      path: data/{split}.jsonl        # or a file, a directory, or {train: a.jsonl, test: b.parquet}
      query_column: question
      ground_truth_column: answer

Where the rows of a split come from (`path`):
- a mapping `{split: file or directory}`;
- a string containing `{split}`, filled in with the split name;
- a directory: the files in it whose name starts with the split name (`train.jsonl`,
  `train-00000-of-00001.parquet`, as `agenttune data download` writes them);
- a plain file: every split reads it (fine when only a train split is configured).
Relative paths are relative to the current directory. Columns map to Task fields as described in
`agenttune.components.readers.columns`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from agenttune.components.readers.base import TaskReader
from agenttune.components.readers.columns import ColumnOptions, RowMapping
from agenttune.errors import UserError
from agenttune.workflow.task import Task

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


class FileTaskReaderOptions(ColumnOptions):
    path: str | dict[str, str] = Field(
        description="Data file(s): a file, a directory, a pattern with {split}, or a mapping split -> file."
    )


class FileTaskReader(TaskReader):
    """Reads tasks from JSONL, JSON (a list of objects) or Parquet files."""

    reads_locally = True

    name: ClassVar[str] = "file"
    Options: ClassVar[type[FileTaskReaderOptions]] = FileTaskReaderOptions
    options: FileTaskReaderOptions

    def check(self, splits: list[str]) -> None:
        for split in splits:
            self.files(split)

    def read(self, split: str) -> Iterator[Task]:
        files = self.files(split)
        where = str(files[0]) if len(files) == 1 else f"{len(files)} files for split {split!r}"
        mapping = RowMapping(self.options, source=str(files[0].parent / files[0].stem), key="task_reader")
        return mapping.tasks(_rows(files), split, where)

    def files(self, split: str) -> list[Path]:
        """The files holding `split`; a UserError when there are none."""
        path = self.options.path
        if isinstance(path, dict):
            if split not in path:
                raise UserError(f"task_reader.path names no file for split {split!r} (it has: {', '.join(path)}).",
                                hint=f"Add `{split}: <file>` under task_reader.path, or change the split name.")
            target = Path(path[split])
        else:
            target = Path(path.replace("{split}", split))
        if not target.exists():
            raise UserError(f"task_reader.path: {str(target)!r} does not exist (split {split!r}).",
                            hint=_missing_path_hint(str(target)))
        files = _split_files(target, split) if target.is_dir() else [target]
        for file in files:
            if file.suffix.lower() not in FORMATS:
                raise UserError(f"task_reader.path: {str(file)!r} is not a .jsonl, .json or .parquet file.",
                                hint="Convert it, or use the huggingface reader, which knows more formats.")
        return files


def _missing_path_hint(path: str) -> str:
    if "$" in path:  # ${DATA_DIR}/train.jsonl: the shell expands variables, a YAML file does not
        return ("Environment variables are not expanded in the config file; write the path itself, or pass it from "
                "the shell as an override (task_reader.path=$DATA_DIR/{split}.jsonl) or as "
                "AGENTTUNE_TASK_READER__PATH.")
    return "Check the path; relative paths start at the current directory."


def _split_files(directory: Path, split: str) -> list[Path]:
    files = sorted(file for file in directory.iterdir()
                   if file.is_file() and file.suffix.lower() in FORMATS
                   and (file.stem == split or file.name.startswith(f"{split}-")))
    if not files:
        present = sorted(file.name for file in directory.iterdir() if file.suffix.lower() in FORMATS)
        raise UserError(f"task_reader.path: directory {str(directory)!r} has no data file for split {split!r} "
                        f"(data files there: {', '.join(present) or 'none'}).",
                        hint=f"Name the files {split}.jsonl / {split}-*.parquet, or map splits to files in task_reader.path.")
    return files


def _rows(files: list[Path]) -> Iterator[dict[str, Any]]:
    for file in files:
        yield from READERS[FORMATS[file.suffix.lower()]](file)


def _jsonl_rows(file: Path) -> Iterator[dict[str, Any]]:
    with _open(file) as lines:
        for number, line in enumerate(_decoded(lines, file), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{file}, line {number}: not valid JSON ({error.msg}).",
                                hint="Each line of a .jsonl file must be one JSON object.") from error
            if not isinstance(row, dict):
                raise UserError(f"{file}, line {number}: expected a JSON object, got {type(row).__name__}.",
                                hint="Each line of a .jsonl file must be one JSON object.")
            yield row


def _json_rows(file: Path) -> Iterator[dict[str, Any]]:
    with _open(file) as handle:
        try:
            data = json.loads("".join(_decoded(handle, file)))
        except json.JSONDecodeError as error:
            raise UserError(f"{file}: not valid JSON ({error.msg} at line {error.lineno}).",
                            hint="A .json file must hold a list of objects (use .jsonl for one object per line).") from error
    if not (isinstance(data, list) and all(isinstance(row, dict) for row in data)):
        raise UserError(f"{file}: expected a JSON list of objects, got {type(data).__name__}.",
                        hint="A .json file must hold a list of objects (use .jsonl for one object per line).")
    yield from data


def _parquet_rows(file: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet  # heavy: only when a parquet file is read

    try:
        parquet = pyarrow.parquet.ParquetFile(file)
    except (OSError, pyarrow.ArrowException) as error:
        raise UserError(f"{file}: cannot read it as Parquet ({error}).", hint="Check that the file is complete.") from error
    for batch in parquet.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _open(file: Path):
    try:
        return file.open(encoding="utf-8")
    except OSError as error:
        raise UserError(f"Cannot read {str(file)!r}: {error.strerror or error}.",
                        hint="Check the file's permissions.") from error


def _decoded(lines: Iterator[str], file: Path) -> Iterator[str]:
    try:
        yield from lines
    except UnicodeDecodeError as error:
        raise UserError(f"{file} is not UTF-8 text ({error.reason} at byte {error.start}).",
                        hint="Save it as UTF-8.") from error


READERS = {"jsonl": _jsonl_rows, "json": _json_rows, "parquet": _parquet_rows}
