"""Tasks written as parquet rows, read back through verl's own dataset class."""

from __future__ import annotations

import pytest
from agenttune_verl.dataset import prompt_messages, task_from_row, write_tasks
from agenttune_verl.launch import write_datasets
from agenttune_verl.translation import VerlPaths
from agenttune_verl.verl_config import build_verl_config

from agenttune.plugin_api import Task, UserError, resolve


def rlhf_dataset(path, verl_data_config, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return RLHFDataset(data_files=str(path), tokenizer=tokenizer, config=verl_data_config)


def test_rows_from_a_task_reader_load_through_verls_dataset(agent_config, tmp_path, tiny_tokenizer):
    config = agent_config()
    paths = VerlPaths.for_run(tmp_path / "run", has_validation=True)
    write_datasets(config, resolve(config), paths)
    verl_config = build_verl_config(config, paths)

    train = rlhf_dataset(paths.train_files, verl_config.data, tiny_tokenizer)
    validation = rlhf_dataset(paths.val_files, verl_config.data, tiny_tokenizer)
    assert (len(train), len(validation)) == (4, 2)

    row = train[1]
    assert row["raw_prompt"] == [{"role": "user", "content": "What is 2 + 3? (#1)"}]
    assert row["agent_name"] == "agenttune"
    assert row["data_source"] == "agenttune/file"
    assert row["reward_model"]["ground_truth"] == "5"
    assert row["index"] == 1  # verl groups a prompt's rollouts by it
    task = task_from_row(row["extra_info"])
    expected = next(t for t in resolve(config).task_reader().read("train") if t.task_id == "train-1")
    assert task == expected  # nested metadata survives the trip
    assert task.metadata["meta"] == {"level": 1, "tags": ["add"]}
    assert validation[0]["extra_info"]["split"] == "validation"


def test_tasks_of_any_shape_survive(tmp_path, tiny_tokenizer):
    from omegaconf import OmegaConf

    tasks = [
        Task(task_id="a", query="plain"),
        Task(task_id="b", init_messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]},
        ], metadata={"ground_truth": 42, "rows": [{"x": 1}, {"y": [2, 3]}]}, env_type="appworld"),
        Task(task_id="c", query="", metadata={"ground_truth": ["x", "y"]}),
    ]
    path = tmp_path / "mixed.parquet"
    assert write_tasks(tasks, path, split="train", data_source="agenttune/test") == 3
    data_config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64, "return_raw_chat": True,
                                    "filter_overlong_prompts": False})
    dataset = rlhf_dataset(path, data_config, tiny_tokenizer)
    assert [task_from_row(dataset[i]["extra_info"]) for i in range(3)] == tasks
    assert dataset[1]["raw_prompt"][1] == {"role": "user", "content": "part one two"}
    assert dataset[1]["reward_model"]["ground_truth"] == "42"
    assert dataset[2]["reward_model"]["ground_truth"] == '["x", "y"]'
    assert dataset[2]["raw_prompt"] == [{"role": "user", "content": ""}]


def test_prompt_is_the_query_without_init_messages():
    assert prompt_messages(Task(task_id="t", query="hi")) == [{"role": "user", "content": "hi"}]


def test_rows_not_written_by_agenttune_are_a_clear_error():
    with pytest.raises(UserError, match="extra_info.task"):
        task_from_row({"index": 0, "split": "train"})


def test_too_few_tasks_for_one_batch_is_a_user_error(agent_config, tmp_path):
    config = agent_config("data.train_batch_size=8")
    with pytest.raises(UserError, match="4 tasks, fewer than data.train_batch_size=8"):
        write_datasets(config, resolve(config), VerlPaths.for_run(tmp_path / "run", has_validation=True))
