"""examples/openenv_game with the debug backbone: the run serves the game itself and the rewards differ."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_runs import records

from agenttune.plugin_api import load_config, train_from_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "openenv_game"

pytest.importorskip("torch")


def test_the_example_runs_with_the_debug_backbone_and_rewards_differ(tmp_path: Path):
    # 8 games x 4 tries: the random tiny model guesses a digit, right or wrong, in some of them (in 4 x 4
    # it happened 3 times in one run), so rewards of 0, 0.1 and 1 all but surely occur.
    config = load_config(EXAMPLE / "openenv_game.yaml", ["debug.first_n_tasks=8"], backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert len(episodes) == 32 and {episode["status"] for episode in episodes} <= {"ok", "madness"}
    assert len({episode["reward"] for episode in episodes}) > 1, "every episode got the same reward"
    assert (run.run_dir / "openenv_server.log").exists()
