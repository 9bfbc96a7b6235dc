"""Objectives end to end on the local backbone: real gateway, `hf` engine on a tiny model, a file
task reader and a judge with varied rewards. Kept to two tiny steps each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

WORKFLOW = '''
from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput


class Reply(Workflow):
    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        response = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.query}], max_tokens=8)
        return WorkflowOutput(metadata={"final_answer": response.choices[0].message.content})


class LengthJudge(Judge):
    def judge(self, judge_input):
        text = judge_input.final_answer or ""
        return JudgeResult(reward=float(len(text) % 3 == 0), success=len(text) % 3 == 0)
'''


def run(tmp_path: Path, run_cli, **algorithm) -> list[dict]:
    (tmp_path / "objective_workflow.py").write_text(WORKFLOW, encoding="utf-8")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "query": f"Say {i}"}) + "\n" for i in range(40)))
    rollout = algorithm.pop("rollout", {})
    config = {
        "workflow": "objective_workflow:Reply",
        "judge": {"judge_protocol": "objective_workflow:LengthJudge"},
        "task_reader": {"type": "file", "path": str(data)},
        "model": {"path": "tiny://h4-objectives?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64",
                  "max_model_len": 256},
        "rollout": {"num_repeat": 3, "max_env_worker": 4, "max_response_length_in_one_turn": 8, **rollout},
        "data": {"train_batch_size": 2},
        "algorithm": algorithm,
        "trainer": {"total_steps": 2, "learning_rate": 1e-3, "seed": 3},
        "local": {"device": "cpu", "plot": False},
        "monitor": {"tensorboard": False},
    }
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = run_cli("train", "--conf", conf, "--backbone", "local", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_dynamic_sampling_trains_a_full_batch_of_groups_with_spread(tmp_path, run_cli):
    records = run(tmp_path, run_cli, dynamic_sampling={"enable": True, "max_retries": 6})
    for record in records:
        assert record["train/zero_variance_groups"] == 0  # the trainer never saw a flat group
        assert record["train/groups"] == record["train/informative_groups"]
        assert record["train/informative_groups"] + record["train/dynamic_sampling_short"] == 2
        assert record["train/dynamic_sampling_rounds"] <= 6


@pytest.mark.slow
def test_num_repeat_1_trains_with_a_batch_baseline(tmp_path, run_cli):
    records = run(tmp_path, run_cli, adv_estimator="reinforce_plus_plus_baseline", rollout={"num_repeat": 1})
    assert all(record["train/samples"] > 0 and record["train/updates"] == 1 for record in records)


@pytest.mark.slow
def test_num_repeat_1_with_grpo_is_refused_before_anything_runs(tmp_path, run_cli):
    with pytest.raises(AssertionError, match="num_repeat is 1"):
        run(tmp_path, run_cli, rollout={"num_repeat": 1})
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
