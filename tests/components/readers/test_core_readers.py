"""The built-in task readers, `file` and `huggingface`, on files the tests write (real `datasets` loading)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agenttune.components.readers.file import FileTaskReader
from agenttune.components.readers.huggingface import HuggingFaceTaskReader
from agenttune.config.models import TaskReaderConfig
from agenttune.errors import UserError
from agenttune.registry.config_loading import component_options
from agenttune.registry.manager import get_component
from agenttune.testing.gsm8k import GSM8K_ROWS


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def file_reader(**options) -> FileTaskReader:
    return FileTaskReader(FileTaskReader.Options(**options))


def hf_reader(**options) -> HuggingFaceTaskReader:
    return HuggingFaceTaskReader(HuggingFaceTaskReader.Options(**options))


# -- the file reader --------------------------------------------------------------------------------

def test_file_reader_maps_columns_and_keeps_the_rest_in_metadata(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [
        {"id": "a1", "prompt": "What is 2+2?", "solution": "4", "difficulty": "easy", "tags": ["math"]},
        {"id": "a2", "prompt": "What is 3+3?", "solution": "6", "difficulty": "easy", "tags": []},
    ])
    tasks = list(file_reader(path=str(path), query_column="prompt", ground_truth_column="solution",
                             id_column="id").read("train"))
    assert [task.task_id for task in tasks] == ["a1", "a2"]
    assert tasks[0].query == "What is 2+2?"
    assert tasks[0].ground_truth == "4"
    assert tasks[0].metadata == {"id": "a1", "solution": "4", "difficulty": "easy", "tags": ["math"],
                                 "ground_truth": "4"}


def test_file_reader_reads_the_same_tasks_from_jsonl_json_and_parquet(tmp_path):
    rows = [{"query": f"question {index}", "ground_truth": index, "task_id": f"t{index}"} for index in range(3)]
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows)
    json_file = tmp_path / "b.json"
    json_file.write_text(json.dumps(rows), encoding="utf-8")
    parquet = write_parquet(tmp_path / "c.parquet", rows)
    results = [[task.model_dump() for task in file_reader(path=str(path)).read("train")]
               for path in (jsonl, json_file, parquet)]
    assert results[0] == results[1] == results[2]
    assert [task["task_id"] for task in results[0]] == ["t0", "t1", "t2"]  # the task_id column by default
    assert [task["metadata"]["ground_truth"] for task in results[0]] == [0, 1, 2]


def test_gsm8k_shaped_rows_need_no_column_settings_when_the_path_names_gsm8k(tmp_path):
    directory = tmp_path / "openai" / "gsm8k" / "main"
    write_parquet(directory / "train-00000-of-00001.parquet", GSM8K_ROWS)
    write_parquet(directory / "test-00000-of-00001.parquet", GSM8K_ROWS[:1])
    reader = file_reader(path=str(directory))
    train = list(reader.read("train"))
    assert [task.task_id for task in train] == ["train-0", "train-1"]
    assert train[0].query.startswith("Natalia sold clips")
    assert [task.ground_truth for task in train] == ["72", "10"]
    assert train[1].metadata["answer"].endswith("#### 10")  # the worked solution stays available
    assert [task.ground_truth for task in reader.read("test")] == ["72"]


def test_gsm8k_preset_by_name_and_switched_off(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", GSM8K_ROWS)
    assert [task.ground_truth for task in file_reader(path=str(path), preset="gsm8k").read("train")] == ["72", "10"]
    named = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    assert [task.ground_truth for task in file_reader(path=str(named)).read("train")] == ["72", "10"]
    with pytest.raises(UserError, match="no column 'query'"):
        list(file_reader(path=str(named), preset="none").read("train"))


def test_explicit_columns_win_over_the_preset(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k" / "train.jsonl", [dict(row, alt="Other question?") for row in GSM8K_ROWS])
    tasks = list(file_reader(path=str(path), query_column="alt").read("train"))
    assert tasks[0].query == "Other question?"
    assert "ground_truth" not in tasks[0].metadata  # no preset: no ground-truth column was named
    assert tasks[0].metadata["question"].startswith("Natalia")


def test_split_pattern_and_split_mapping(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"query": "t"}])
    write_jsonl(tmp_path / "dev.jsonl", [{"query": "d"}])
    pattern = file_reader(path=str(tmp_path / "{split}.jsonl"))
    assert [task.query for task in pattern.read("dev")] == ["d"]
    mapping = file_reader(path={"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "dev.jsonl")})
    assert [task.query for task in mapping.read("validation")] == ["d"]
    with pytest.raises(UserError, match="names no file for split 'test'"):
        mapping.read("test")


def test_init_messages_column(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"query": "Hi", "history": messages}])
    (task,) = file_reader(path=str(path), messages_column="history").read("train")
    assert task.init_messages == messages
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "Hi", "history": "not messages"}])
    with pytest.raises(UserError, match="not a list of chat messages"):
        list(file_reader(path=str(bad), messages_column="history").read("train"))


@pytest.mark.parametrize(("content", "expected"), [
    ("", "has no rows for split 'train'"),
    ('{"query": "ok"}\n{"query": \n', "line 2: not valid JSON"),
    ('["a list"]\n', "line 1: expected a JSON object"),
    ('{"query": "a", "task_id": "x"}\n{"query": "b", "task_id": "x"}\n', "task id 'x' appears twice"),
    ('{"query": ""}\n', "row 1 has an empty 'query'"),
    ('{"question": "q"}\n', "no column 'query'.*Its columns are: question.*task_reader.query_column"),
])
def test_file_reader_errors_name_the_file_and_the_fix(tmp_path, content, expected):
    path = tmp_path / "tasks.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=expected) as raised:
        list(file_reader(path=str(path)).read("train"))
    assert "tasks.jsonl" in str(raised.value) or "no rows" in str(raised.value)


def test_file_reader_missing_paths(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        file_reader(path=str(tmp_path / "nope.jsonl")).check(["train"])
    (tmp_path / "data.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(UserError, match="not a .jsonl, .json or .parquet file"):
        file_reader(path=str(tmp_path / "data.csv")).check(["train"])
    write_jsonl(tmp_path / "dir" / "train.jsonl", [{"query": "q"}])
    with pytest.raises(UserError, match="no data file for split 'test'.*train.jsonl"):
        file_reader(path=str(tmp_path / "dir")).check(["train", "test"])


def test_unknown_reader_option_is_a_user_error_with_a_suggestion():
    section = TaskReaderConfig(type="file", path="x.jsonl", qeury_column="q")
    with pytest.raises(UserError, match="unknown key 'task_reader.qeury_column'; did you mean 'task_reader.query_column'"):
        component_options(FileTaskReader, section, "task_reader")


def test_file_reader_requires_a_path():
    with pytest.raises(UserError, match="task_reader.path is required"):
        component_options(FileTaskReader, TaskReaderConfig(type="file"), "task_reader")


# -- the huggingface reader -------------------------------------------------------------------------

def test_huggingface_reader_loads_a_local_dataset_directory_with_the_gsm8k_preset(tmp_path):
    directory = tmp_path / "openai" / "gsm8k" / "main"
    write_parquet(directory / "train-00000-of-00001.parquet", GSM8K_ROWS)
    write_parquet(directory / "test-00000-of-00001.parquet", GSM8K_ROWS[1:])
    reader = hf_reader(dataset_path=str(directory))
    train = list(reader.read("train"))
    assert [(task.task_id, task.ground_truth) for task in train] == [("train-0", "72"), ("train-1", "10")]
    assert train[0].query == GSM8K_ROWS[0]["question"]
    assert [task.ground_truth for task in reader.read("test")] == ["10"]


def test_huggingface_reader_with_a_builder_and_data_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"q": "one", "a": 1, "extra": "x"}, {"q": "two", "a": 2, "extra": "y"}])
    reader = hf_reader(dataset_path="json", data_files={"train": str(tmp_path / "train.jsonl")},
                       query_column="q", ground_truth_column="a")
    tasks = list(reader.read("train"))
    assert [(task.query, task.ground_truth, task.metadata["extra"]) for task in tasks] == [
        ("one", 1, "x"), ("two", 2, "y")]
    assert [task.query for task in reader.read("train[1:]")] == ["two"]  # datasets' split slicing works


def test_huggingface_reader_errors(tmp_path):
    directory = tmp_path / "gsm8k"
    write_jsonl(directory / "train.jsonl", GSM8K_ROWS)
    with pytest.raises(UserError, match="Unknown split \"validation\".*split names"):
        list(hf_reader(dataset_path=str(directory)).read("validation"))
    with pytest.raises(UserError, match="has no column 'questoin'.*Did you mean 'question'"):
        list(hf_reader(dataset_path=str(directory), query_column="questoin").read("train"))
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(UserError, match="has no rows"):
        list(hf_reader(dataset_path="json", data_files=str(tmp_path / "empty.jsonl")).read("train"))


def test_empty_splits_are_errors_not_silence(tmp_path):
    (tmp_path / "header_only").mkdir()
    (tmp_path / "header_only" / "train.csv").write_text("query,answer\n", encoding="utf-8")
    with pytest.raises(UserError, match="split 'train' has no rows"):
        list(hf_reader(dataset_path=str(tmp_path / "header_only")).read("train"))
    empty = pa.Table.from_pylist([], schema=pa.schema([("query", pa.string())]))
    pq.write_table(empty, tmp_path / "empty.parquet")
    with pytest.raises(UserError, match="has no rows for split 'train'"):
        list(file_reader(path=str(tmp_path / "empty.parquet")).read("train"))


def test_huggingface_reader_without_network_says_how_to_get_the_data(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match="Hugging Face Hub is not reachable.*agenttune data download"):
        list(hf_reader(dataset_path="openai/gsm8k", name="main").read("train"))


# -- configuration shapes ------------------------------------------------------------------------------

def test_astune_reader_section_shape_is_accepted(tmp_path):
    directory = tmp_path / "gsm8k" / "main"
    write_jsonl(directory / "train.jsonl", GSM8K_ROWS)
    section = TaskReaderConfig.model_validate({
        "type": "huggingface_dat_repo",
        "huggingface_dat_repo": {"dataset_path": str(directory), "training_split": "train",
                                 "validation_split": "test"},
    })
    assert (section.type, section.train_split, section.validation_split) == ("huggingface", "train", "test")
    options = component_options(HuggingFaceTaskReader, section, "task_reader")
    assert [task.ground_truth for task in HuggingFaceTaskReader(options).read("train")] == ["72", "10"]


def test_builtins_register_both_readers():
    assert get_component("task_readers", "file") is FileTaskReader
    assert get_component("task_readers", "huggingface") is HuggingFaceTaskReader
