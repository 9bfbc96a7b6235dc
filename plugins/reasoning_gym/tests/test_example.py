"""examples/reasoning_gym: the debug run a user starts first, and a short local training run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLE, rollout_records

from agenttune.plugin_api import MetricsLog, load_config, train_from_config

pytest.importorskip("torch")


def test_the_debug_run_of_the_example_shows_rewards_that_are_not_all_equal(tmp_path: Path) -> None:
    config = load_config(EXAMPLE / "reasoning_gym.yaml", ["debug.first_n_tasks=2"], backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    records = rollout_records(run.run_dir)
    assert len(records) == 2 * 8  # debug.first_n_tasks x rollout.num_repeat
    # madness: the random model's reply tripped a garbage check (a status of a judged episode, not a failure)
    assert {record["status"] for record in records} <= {"ok", "madness"}
    rewards = [record["reward"] for record in records]
    assert len(set(rewards)) > 1, rewards
    assert all(0.0 <= reward <= 1.0 for reward in rewards)


def test_the_local_backbone_takes_what_it_needs_from_the_endless_training_split(tmp_path: Path) -> None:
    config = load_config(EXAMPLE / "reasoning_gym.yaml", [
        "trainer.total_steps=1", "trainer.test_freq=1", "data.train_batch_size=2", "rollout.num_repeat=2",
        "data.val_batch_size=4", "rollout.max_response_length_in_one_turn=8", "trainer.save_freq=0"],
        backbone="local")
    run = train_from_config(config, run_dir=tmp_path / "run")
    records = MetricsLog(run.run_dir / "metrics.jsonl").read()
    assert any("reward/mean" in record for record in records)
    assert any(record.get("val/success_rate") is not None for record in records)


def test_an_endless_training_split_without_total_steps_is_one_paragraph(tmp_path: Path) -> None:
    from agenttune.plugin_api import UserError

    config = load_config(EXAMPLE / "reasoning_gym.yaml", ["trainer.total_steps=null", "trainer.total_epochs=1"],
                         backbone="local")
    with pytest.raises(UserError, match="endless.*trainer.total_steps"):
        train_from_config(config, run_dir=tmp_path / "run")
