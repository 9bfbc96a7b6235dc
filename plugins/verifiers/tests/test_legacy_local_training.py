"""A verifiers 0.1-0.3 multi-turn tool environment trains with `--backbone local` on the tiny model, unchanged.

A random tiny model: the environment's rollouts run (its tool offered), its Rubric scores them in the
judge, and GRPO takes real steps on the tokens the gateway recorded; validation runs the eval rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import config_data, rollout_records, write_config

from agenttune.plugin_api import load_config, train_from_config


@pytest.mark.timeout(600)
def test_a_tool_environment_trains_with_the_local_backbone(tmp_path: Path) -> None:
    data = config_data("vf03-add-tool", model={"max_model_len": 512},
                       task_reader={"args": {"num_tasks": 2}, "max_turns": 2, "validation_split": "test"},
                       rollout={"num_repeat": 2, "max_env_worker": 4, "max_response_length_in_one_turn": 12},
                       # one GRPO group per step and one validation (at step 2): each episode starts verifiers'
                       # harness program (and tool server) as processes, seconds each, so the run stays short
                       data={"train_batch_size": 1},
                       trainer={"total_steps": 2, "learning_rate": 1e-2, "val_before_train": False, "test_freq": 2,
                                "save_freq": 0, "seed": 3},
                       local={"device": "cpu", "micro_batch_tokens": 512, "plot": False})
    run = train_from_config(load_config(write_config(tmp_path, data), backbone="local"), run_dir=tmp_path / "run")
    train = rollout_records(run.run_dir, "step_*_train.jsonl")
    assert len(train) == 2 * 1 * 2  # 2 steps x 1 task x 2 repeats
    assert all(r["status"] == "ok" for r in train), [r["error"] for r in train]
    assert all(r["samples"] and sum(r["samples"][0]["loss_mask"]) > 0 for r in train)  # every episode trained
    assert all("reward/correct" in r["judge_details"] for r in train)
    assert rollout_records(run.run_dir, "step_*_validation.jsonl")  # validation ran through the same path
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    updates = [m for m in metrics if "train/loss" in m or "actor/pg_loss" in m or "loss" in m]
    assert len(updates) >= 2, metrics[-1].keys()
