"""The three kinds of verifiers environment (single-turn, tool, custom multi-turn) with `--backbone debug`.

The real verifiers package runs its own rollout; the model is agenttune's scripted engine behind the
gateway, so the rewards and the recorded tokens are known exactly.
"""

from __future__ import annotations

from pathlib import Path

from conftest import config_data, rollout_records, write_config

from agenttune.plugin_api import load_config, train_from_config


def debug_run(tmp_path: Path, data: dict) -> list[dict]:
    config = load_config(write_config(tmp_path, data), backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    return rollout_records(run.run_dir)


def test_a_single_turn_environment_is_read_rolled_out_and_scored_by_its_own_reward(tmp_path: Path) -> None:
    records = debug_run(tmp_path, config_data("vf-say-word", replies=["apple", "wrong"]))
    assert len(records) == 4  # 2 tasks x 2 repeats
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    by_task: dict[str, list[float]] = {}
    for record in records:
        by_task.setdefault(record["task"]["task_id"], []).append(record["reward"])
    # the scripted engine answers "apple" then "wrong" in turn: task say-0's answer is apple
    assert sorted(r["reward"] for r in records) == [0.0, 0.0, 0.0, 1.0]
    apple = next(r for r in records if r["reward"] == 1.0)
    assert apple["task"]["task_id"] == "say-0"
    assert apple["judge_details"]["reward/exact"] == 1.0
    assert apple["judge_details"]["metric/reply_chars"] == 5.0
    summary = apple["output"]["verifiers"][0]
    assert summary["ok"] and summary["stop_condition"] == "agent_completed"
