"""The `huggingface` task reader: tasks from anything `datasets.load_dataset` can load.

    task_reader:
      type: huggingface
      dataset_path: openai/gsm8k     # a hub name, a local directory, or a builder (json, parquet, csv)
      name: main                     # the subset (config) name, if the dataset has several
      train_split: train
      validation_split: test

Hub names need a network (or the local Hugging Face cache). A directory written by
`agenttune data download` loads offline. For `openai/gsm8k` (and any path naming gsm8k) the columns
preset applies: query <- question, ground truth <- the number after "####" in answer.
`datasets` is imported only when tasks are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field

from agenttune.components.readers.base import TaskReader
from agenttune.components.readers.columns import ColumnOptions, RowMapping
from agenttune.errors import UserError
from agenttune.workflow.task import Task


class HuggingFaceTaskReaderOptions(ColumnOptions):
    dataset_path: str = Field(
        description="What load_dataset loads: a hub name (openai/gsm8k), a local directory, or a builder "
        "name (json, parquet, csv) together with data_files."
    )
    name: str | None = Field(default=None, description="Subset (configuration) name, e.g. 'main' for GSM8K.")
    subset: str | None = Field(default=None, description="Same as `name` (use one of the two).")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        default=None, description="Files to load, as load_dataset's data_files (a path, a list, or split -> paths)."
    )
    revision: str | None = Field(default=None, description="Dataset revision (branch, tag or commit) on the hub.")
    cache_dir: str | None = Field(default=None, description="Where datasets caches downloads; default: HF's cache.")

    @property
    def subset_name(self) -> str | None:
        return self.name or self.subset


class HuggingFaceTaskReader(TaskReader):
    """Reads tasks from a Hugging Face dataset (hub or local) through `datasets.load_dataset`."""

    name: ClassVar[str] = "huggingface"
    Options: ClassVar[type[HuggingFaceTaskReaderOptions]] = HuggingFaceTaskReaderOptions
    options: HuggingFaceTaskReaderOptions

    def read(self, split: str) -> Iterator[Task]:
        dataset = self.load(split)
        where = self._describe(split)
        mapping = RowMapping(self.options, source=self.options.dataset_path, key="task_reader")
        mapping.check_columns(dataset.column_names, where)
        return mapping.tasks(dataset, split, where)

    def load(self, split: str) -> Any:
        """The split as a `datasets.Dataset`; every loading failure becomes a UserError."""
        options = self.options
        if options.name and options.subset and options.name != options.subset:
            raise UserError(f"task_reader.name ({options.name!r}) and task_reader.subset ({options.subset!r}) differ.",
                            hint="Set only one of them.")
        import datasets  # heavy: only when tasks are read

        try:
            return datasets.load_dataset(options.dataset_path, options.subset_name, split=split,
                                         data_files=options.data_files, revision=options.revision,
                                         cache_dir=options.cache_dir)
        except ConnectionError as error:
            raise UserError(
                f"Cannot load dataset {options.dataset_path!r}: the Hugging Face Hub is not reachable ({error}).",
                hint="Download it once where there is a network (`agenttune data download DATASET --path DIR`), "
                "then point task_reader.dataset_path at DIR/<dataset>/<subset>.",
            ) from error
        except Exception as error:  # unknown split, missing files, bad subset, ...: datasets says which
            if _means_no_rows(error):
                raise UserError(f"{self._describe(split)} has no rows.",
                                hint="Check the data files and the split name.") from error
            raise UserError(f"Cannot load {self._describe(split)}: {_explain(error)}",
                            hint="Check task_reader.dataset_path, name/subset, data_files and the split names.") from error

    def _describe(self, split: str) -> str:
        subset = f" (subset {self.options.subset_name!r})" if self.options.subset_name else ""
        return f"dataset {self.options.dataset_path!r}{subset}, split {split!r}"


def _means_no_rows(error: Exception) -> bool:
    # datasets never returns an empty split: an empty json file raises StopIteration, an empty
    # csv or slice "corresponds to no data".
    return isinstance(error, StopIteration) or "corresponds to no data" in str(error)


def _explain(error: BaseException) -> str:
    """The error and, for datasets' generic wrappers, the error underneath."""
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__ or error.__context__
    if cause is not None and str(cause) not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text
