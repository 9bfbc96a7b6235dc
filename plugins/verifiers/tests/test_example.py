"""examples/verifiers_env runs with `--backbone debug` on the tiny model and its rewards are not all equal."""

from __future__ import annotations

import json
from pathlib import Path

from agenttune.plugin_api import load_config, train_from_config

EXAMPLE = Path(__file__).parents[3] / "examples" / "verifiers_env" / "verifiers_env.yaml"


def test_the_example_debug_run_shows_rewards_that_differ(tmp_path: Path) -> None:
    config = load_config(EXAMPLE, backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    records = [json.loads(line) for path in sorted((run.run_dir / "rollouts").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(records) == 16  # debug.first_n_tasks 4 x rollout.num_repeat 4
    # a random tiny model: a madness check may fire on an episode (a normal end, penalty reward), none may fail
    assert all(r["status"] in ("ok", "madness") for r in records), [r["error"] for r in records]
    assert len({r["reward"] for r in records}) > 1
    scored = [r for r in records if r["status"] == "ok"]
    assert len(scored) >= 12
    assert all("reward/overlap" in r["judge_details"] and "metric/reply_chars" in r["judge_details"] for r in scored)
