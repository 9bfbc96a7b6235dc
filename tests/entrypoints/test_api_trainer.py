"""`agenttune.Trainer`: the Python API runs the CLI's code path (`train_from_config`) with objects in
place of references. Real runs use the debug backbone with the scripted engine and the tiny tokenizer;
datasets are real `datasets.Dataset` objects and real files."""

from __future__ import annotations

import json
import subprocess
import sys

import datasets
import pytest
import yaml

import agenttune
from agenttune import Judge, JudgeResult, Task, Trainer, Workflow, WorkflowOutput
from agenttune.config.references import load_reference
from agenttune.entrypoints.python_api import training_config
from agenttune.errors import UserError
from agenttune.rollout.log import read_records

ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 + 3?", "answer": "6"}]
TEST_ROWS = [{"question": "What is 5 + 5?", "answer": "10"}]


class AnswerWorkflow(Workflow):
    """Asks the model once; hands its reply to the judge."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model=tuner.model_name,
                                                     messages=[{"role": "user", "content": task.query}])
        answer = reply.choices[0].message.content
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer})


class ExactJudge(Judge):
    def judge(self, judge_input):
        correct = str(judge_input.final_answer).strip() == str(judge_input.task.ground_truth)
        return JudgeResult(reward=float(correct), success=correct)


def scripted(*replies: str, **sections):
    """A debug run on the scripted engine: the replies, in order, one episode at a time."""
    return {"model": {"path": "tiny://default", "max_model_len": 512},
            "engine": {"type": "scripted", "replies": list(replies)},
            "rollout": {"num_repeat": 1, "max_response_length_in_one_turn": 32},
            "debug": {"first_n_tasks": 8, "max_parallel": 1}, **sections}


def records(run, split="train", step=1):
    return list(read_records(run.run_dir / "rollouts" / f"step_{step:06d}_{split}.jsonl"))


def test_trainer_runs_a_workflow_and_judge_on_an_in_memory_dataset(tmp_path):
    dataset = datasets.Dataset.from_list(ROWS)
    trainer = Trainer(scripted("4", "7"), workflow=AnswerWorkflow, judge=ExactJudge, train_dataset=dataset,
                      backbone="debug", overrides=["task_reader.query_column=question",
                                                   "task_reader.ground_truth_column=answer"],
                      run_dir=tmp_path / "run")
    run = trainer.train()
    assert run.run_dir == tmp_path / "run"
    got = [(r.task.query, r.output["final_answer"], r.reward) for r in records(run)]
    assert got == [("What is 2 + 2?", "4", 1.0), ("What is 3 + 3?", "7", 0.0)]
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert saved["backbone"] == "debug" and saved["task_reader"]["type"] == "in_memory"
    assert saved["workflow"] == "test_api_trainer:AnswerWorkflow"  # importable: its own name, not a copy
    assert saved["judge"] == {**saved["judge"], "type": "custom", "judge_protocol": "test_api_trainer:ExactJudge"}


def test_classes_defined_in_a_function_and_list_datasets_work(tmp_path):
    class LocalWorkflow(Workflow):
        async def execute(self, task, tuner):
            return WorkflowOutput(reward=float(len(task.query)), metadata={"seen": task.metadata["tag"]})

    run = Trainer(scripted("unused"), workflow=LocalWorkflow, backbone="debug",
                  train_dataset=[{"query": "abc", "tag": "x"}, {"query": "hello", "tag": "y"}],
                  run_dir=tmp_path / "run").train()
    assert [(r.reward, r.output["seen"]) for r in records(run)] == [(3.0, "x"), (5.0, "y")]
    reference = run.config.workflow
    assert reference.startswith("agenttune.config.in_process:LocalWorkflow_")
    assert load_reference(reference) is LocalWorkflow


def test_test_dataset_becomes_the_validation_split(tmp_path):
    train = datasets.Dataset.from_list(ROWS)
    test = datasets.Dataset.from_list(TEST_ROWS)
    config = training_config(scripted("x"), workflow=AnswerWorkflow, train_dataset=train, test_dataset=test,
                             overrides=["task_reader.query_column=question", "trainer.test_freq=1"])
    assert (config.task_reader.train_split, config.task_reader.validation_split) == ("train", "test")
    from agenttune.registry.resolution import resolve_task_reader

    reader = resolve_task_reader(config)
    assert [task.query for task in reader.read("test")] == ["What is 5 + 5?"]
    assert [task.metadata["answer"] for task in reader.read("train")] == ["4", "6"]


def test_paths_use_the_file_reader_and_keep_column_options(tmp_path):
    for name, rows in (("train.jsonl", ROWS), ("test.jsonl", TEST_ROWS)):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    base = {"task_reader": {"type": "huggingface", "dataset_path": "openai/gsm8k", "query_column": "question",
                            "ground_truth_column": "answer", "validation_split": "dev"},
            "trainer": {"test_freq": 1}}
    config = training_config(base, train_dataset=tmp_path / "train.jsonl", test_dataset=str(tmp_path / "test.jsonl"))
    section = config.task_reader
    assert section.type == "file" and section.validation_split == "dev"
    assert section.options() == {"path": {"train": str(tmp_path / "train.jsonl"), "dev": str(tmp_path / "test.jsonl")},
                                 "query_column": "question", "ground_truth_column": "answer"}


def test_the_cli_and_the_api_resolve_a_yaml_file_the_same_way(tmp_path, write_yaml, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_ROLLOUT__TOP_P", "0.5")  # the environment counts for both
    conf = write_yaml({"workflow": "test_api_trainer:AnswerWorkflow", "rollout": {"num_repeat": 3},
                       "task_reader": {"type": "file", "path": "tasks.jsonl"}})
    from agenttune.registry.config_loading import load_config

    cli = load_config(conf, ["rollout.temperature=0.7"], backbone="debug", agent_framework=None)
    api = training_config(conf, overrides=["rollout.temperature=0.7"], backbone="debug")
    assert api.model_dump() == cli.model_dump()
    assert api.source_dir == cli.source_dir == tmp_path
    assert (api.rollout.top_p, api.rollout.temperature, api.backbone) == (0.5, 0.7, "debug")


def test_a_config_object_keeps_its_values_and_plugin_sections(tmp_path):
    from agenttune.config.models import AgentTuneConfig

    config = AgentTuneConfig(rollout={"num_repeat": 5}, backbone="debug")
    resolved = training_config(config, workflow="a.b:C", overrides=["rollout.top_k=3"])
    assert (resolved.rollout.num_repeat, resolved.rollout.top_k, resolved.workflow) == (5, 3, "a.b:C")
    assert config.workflow is None  # the caller's object is not changed


def test_judge_by_registered_name_keeps_the_judge_settings():
    config = training_config({"judge": {"judge_protocol": "x:Y", "timeout": 9}}, judge="llm_judge")
    assert (config.judge.type, config.judge.judge_protocol, config.judge.timeout) == ("llm_judge", None, 9)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"config": 42}, r"Trainer\(config=...\) got a int"),
    ({"workflow": AnswerWorkflow()}, r"Trainer\(workflow=...\) got a AnswerWorkflow instance"),
    ({"test_dataset": ROWS}, r"test_dataset but no train_dataset"),
    ({"train_dataset": ROWS, "test_dataset": "test.jsonl"}, r"one dataset as a path and the other as an object"),
    ({"train_dataset": 7}, r"The 'train' dataset is a int"),
    ({"config": {"rollout": {"num_repet": 2}}}, r"the config dict: unknown key 'rollout.num_repet'; did you mean"),
    ({"overrides": ["rollout.num_repeat=0"]}, r"rollout.num_repeat = 0 is invalid"),
])
def test_bad_arguments_are_one_clear_user_error(arguments, message):
    with pytest.raises(UserError, match=message):
        Trainer(**arguments)


def test_a_missing_workflow_module_fails_before_the_run_directory_exists(tmp_path):
    trainer = Trainer(scripted("x"), workflow="no_such_module:W", train_dataset=ROWS, backbone="debug",
                      run_dir=tmp_path / "run")
    with pytest.raises(UserError, match="workflow: cannot import module 'no_such_module'"):
        trainer.train()
    assert not (tmp_path / "run").exists()


def test_an_unused_test_dataset_is_warned_about():
    with pytest.warns(UserWarning, match="never validates on it"):
        training_config(train_dataset=ROWS, test_dataset=TEST_ROWS)


def test_tasks_are_accepted_as_they_are(tmp_path):
    tasks = [Task(task_id="t1", query="q1", metadata={"ground_truth": "a"}), Task(task_id="t2", query="q2")]
    config = training_config(train_dataset=tasks)
    from agenttune.registry.resolution import resolve_task_reader

    assert list(resolve_task_reader(config).read("train")) == tasks


@pytest.mark.slow
def test_import_agenttune_does_not_import_the_trainer_or_heavy_libraries():
    code = ("import sys, agenttune; print(sorted(m for m in ('agenttune.entrypoints.python_api', 'torch', 'datasets', "
            "'transformers') if m in sys.modules)); agenttune.Trainer; print('agenttune.entrypoints.python_api' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.split() == ["[]", "True"]
    assert agenttune.Trainer is Trainer
