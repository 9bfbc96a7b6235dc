"""The `in_memory` task reader: datasets, lists of rows and lists of Tasks named by reference, from a
YAML config as from `agenttune.Trainer`."""

from __future__ import annotations

import uuid

import datasets
import pytest

from agenttune.components.readers.in_memory import InMemoryTaskReader
from agenttune.config.in_process import importable_reference, keep, reference_for
from agenttune.config.references import load_reference
from agenttune.errors import UserError
from agenttune.registry.config_loading import load_config
from agenttune.registry.resolution import resolve_task_reader
from agenttune.workflow.task import Task


def reader(**options) -> InMemoryTaskReader:
    return InMemoryTaskReader(InMemoryTaskReader.Options(**options))


def test_a_yaml_config_names_rows_in_a_module(tmp_path, write_yaml, monkeypatch):
    monkeypatch.chdir(tmp_path)  # modules are found from the current directory, as data files are
    module = f"rows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "import datasets\n"
        "TRAIN = datasets.Dataset.from_list([{'id': 'a', 'prompt': 'p1', 'gold': '1'}, {'id': 'b', 'prompt': 'p2', 'gold': '2'}])\n",
        encoding="utf-8")
    conf = write_yaml({"task_reader": {"type": "in_memory", "splits": {"train": f"{module}:TRAIN"},
                                       "query_column": "prompt", "ground_truth_column": "gold", "id_column": "id"}})
    config = load_config(conf)
    tasks = list(resolve_task_reader(config).read("train"))
    assert [(t.task_id, t.query, t.ground_truth) for t in tasks] == [("a", "p1", "1"), ("b", "p2", "2")]


def test_a_missing_column_of_a_dataset_is_named_before_any_row_is_read():
    rows = keep(datasets.Dataset.from_list([{"prompt": "x"}]))
    with pytest.raises(UserError, match=r"has no column 'query'.*Its columns are: prompt"):
        next(reader(splits={"train": rows}).read("train"))


@pytest.mark.parametrize(("data", "message"), [
    ([], r"has no rows for split 'train'"),
    ([{"query": "a"}, "b"], r"row 2 is a str, not a mapping"),
    ([Task(task_id="t", query="a"), {"query": "b"}], r"item 2 is a dict, but the first item is a Task"),
    ([Task(task_id="t", query="a"), Task(task_id="t", query="b")], r"task id 't' appears twice"),
    ({"query": "a"}, r"is a dict, not a dataset"),
    (3, r"is a int, not a dataset"),
])
def test_bad_data_is_a_user_error(data, message):
    with pytest.raises(UserError, match=message):
        list(reader(splits={"train": keep(data)}).read("train"))


def test_a_split_without_data_is_reported_by_check():
    with pytest.raises(UserError, match=r"names no data for split 'test' \(it has: train\)"):
        reader(splits={"train": keep([{"query": "a"}])}).check(["train", "test"])


def test_references_to_objects_of_another_process_fail_clearly():
    with pytest.raises(UserError, match=r"has no attribute 'gone_1'"):
        load_reference("agenttune.config.in_process:gone_1")


def test_reference_for_prefers_an_importable_name():
    assert importable_reference(InMemoryTaskReader) == "agenttune.components.readers.in_memory:InMemoryTaskReader"
    assert reference_for(InMemoryTaskReader) == "agenttune.components.readers.in_memory:InMemoryTaskReader"

    def local():
        pass

    reference = reference_for(local)
    assert reference.startswith("agenttune.config.in_process:local_") and load_reference(reference) is local
