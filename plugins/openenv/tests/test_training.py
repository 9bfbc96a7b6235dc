"""Training on an OpenEnv game: `--backbone local` with the tiny model (two GRPO steps), and the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from test_runs import TINY, config_data, config_for, records

from agenttune.plugin_api import cli_main as agenttune_main
from agenttune.plugin_api import train_from_config

pytest.importorskip("torch")


def test_local_training_on_the_guessing_game(tmp_path: Path, guess_server):
    server = guess_server
    config = config_for(
        tmp_path, replace={"engine": {"type": "hf"}, "openenv": {"url": server.url}}, backbone="local",
        model={"path": TINY, "max_model_len": 512},
        rollout={"num_repeat": 4, "max_response_length_in_one_turn": 6, "temperature": 1.0},
        data={"train_batch_size": 2, "max_prompt_length": 256, "max_response_length": 64},
        trainer={"total_steps": 2, "learning_rate": 1e-3},
        local={"device": "cpu", "plot": False, "keep_checkpoints": 1})
    run = train_from_config(config, run_dir=tmp_path / "run")
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    train_steps = [row for row in metrics if "failure_rate" in row and row.get("step") in (1, 2)]
    assert {row["step"] for row in train_steps} == {1, 2}
    episodes = records(run.run_dir)
    # madness: a random tiny model may leak a special token, which the madness checks penalize; no failures
    assert len(episodes) == 16 and {episode["status"] for episode in episodes} <= {"ok", "madness"}
    assert all(episode["samples"] for episode in episodes)  # the model's replies were recorded to train on
    assert server.stats()["live"] == 0


def test_the_cli_trains_with_the_debug_backbone(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch,
                                                guess_server):
    data = config_data(replace={"openenv": {"url": guess_server.url}})
    path = tmp_path / "guess.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["agenttune", "train", "--conf", str(path), "--backbone", "debug",
                                      "--run-dir", str(tmp_path / "run")])
    try:
        agenttune_main()
    except SystemExit as exit_:
        assert exit_.code in (0, None), capsys.readouterr()
    assert "12 episodes" in capsys.readouterr().out
