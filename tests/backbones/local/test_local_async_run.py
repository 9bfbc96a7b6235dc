"""Asynchronous training end to end: `trainer.mode: async` with the hf engine, killed with SIGKILL
between checkpoints and resumed with --resume.

Asynchronous runs are not bitwise reproducible (which group finishes first depends on timing), so
the check is the one that matters for data: every group taken from the task order is trained once
or is still pending at the end (stored in the last checkpoint) — none lost at the kill, none
trained twice after the resume — and the rollout log records, per token, the policy version that
sampled it, within the staleness bound.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from test_faults_resume import (
    TINY,
    TOTAL_STEPS,
    checkpoints,
    episodes,
    kill_after_step,
    steps_written,
    train,
    write_project,
)

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
BOUND = 4


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    from agenttune.components.engines.model_loading import resolve_model_path

    resolve_model_path(TINY)
    root = tmp_path_factory.mktemp("async")
    conf = write_project(root / "project")
    config = yaml.safe_load(conf.read_text())
    config["trainer"].update({"mode": "async", "max_staleness": BOUND})
    config["rollout"]["max_env_worker"] = 8
    conf.write_text(yaml.safe_dump(config))
    run_dir = root / "run"
    kill_after_step(train(conf, run_dir), run_dir, 3)
    assert checkpoints(run_dir) == ["step_000002"]
    resumed = train(conf, run_dir, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    (run_dir / "resumed.stderr").write_text(resumed.stderr.read())
    return run_dir


def test_the_run_stops_its_groups_before_its_judge_workers(crashed):
    """Groups still rolling out at the last step used to reach the judge after the session had
    stopped its workers, start new ones, and leave them to the end-of-run kill (a warning each run)."""
    log = (crashed / "resumed.stderr").read_text()
    assert "checkpoint saved" in log, log[-2000:]
    assert "still running at its end" not in log, log[-2000:]


def drawn_task_ids(run_dir: Path, count: int) -> list[str]:
    """The first `count` tasks the task order hands out (seed 3, batches of 4, as configured)."""
    from agenttune.backbones.local.task_order import TaskOrder
    from agenttune.workflow.task import Task

    rows = [json.loads(line) for line in (run_dir.parent / "project" / "train.jsonl").read_text().splitlines()]
    order = TaskOrder([Task(**row) for row in rows], batch_size=4, seed=3)
    drawn: list[str] = []
    while len(drawn) < count:
        drawn += [task.task_id for task in order.next_batch()]
    return drawn[:count]


def test_every_group_taken_is_trained_once_or_still_pending(crashed):
    assert steps_written(crashed) == list(range(1, TOTAL_STEPS + 1))
    trained = [group for step in range(1, TOTAL_STEPS + 1)
               for group in {(e["group_id"], e["task"]["task_id"]) for e in episodes(crashed, step)}]
    assert all(len(episodes(crashed, step)) == 16 for step in range(1, TOTAL_STEPS + 1))  # 4 groups x 4
    state = json.loads((crashed / "checkpoints" / "step_000005" / "state.json").read_text())
    pending = [task["task_id"] for task in state["extra"]["pending_tasks"]]
    trained_ids = [task_id for _, task_id in trained]
    assert Counter(trained_ids) + Counter(pending) == Counter(drawn_task_ids(crashed, len(trained) + len(pending)))
    metrics = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert all(record.get("async/dropped_groups_total", 0) == 0 for record in metrics)


def test_tokens_record_their_policy_version_within_the_bound(crashed):
    lags = Counter()
    for step in range(1, TOTAL_STEPS + 1):
        for episode in episodes(crashed, step):
            for sample in episode["samples"]:
                versions = [v for v, mask in zip(sample["policy_versions"], sample["loss_mask"], strict=True) if mask]
                assert versions and all(0 <= step - 1 - v <= BOUND for v in versions)
                assert versions == sorted(versions)  # a weight update only moves a sample forward
                lags.update(step - 1 - v for v in versions)
    assert lags[0] > 0 and sum(count for lag, count in lags.items() if lag > 0) > 0  # both fresh and off-policy


def test_the_update_takes_its_threads_only_when_the_next_batch_is_complete(crashed):
    """On CPU the update's micro-batches run side by side only while a whole batch for the next step waits
    (update_threads.py); otherwise on one thread, leaving the other cores to the rollout."""
    metrics = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in metrics if "perf/update_threads" in record]
    assert len(steps) >= TOTAL_STEPS
    for record in steps:
        ahead = record["async/groups_waiting"] >= 4 and torch.get_num_threads() > 1
        assert record["perf/update_threads"] == (torch.get_num_threads() if ahead else 1), record
