"""Fault injection during a real debug run and a real local GRPO training run (tiny model, CPU).

About 10% of workflows raise, 5% hang past the episode timeout, the engine fails every request of 5%
and the first request of another 5% (their clients retry), and the judge raises on 5% (see
agenttune.testing.faults for the plan). The runs must finish all their steps; every failure is
counted by cause in metrics.jsonl, exactly as the rollout log records it; no episode is missing
from the log; no thread or process is left behind. The EnvService part (a server that answers 5xx and
is killed once) is in plugins/envservice/tests/test_faults_envservice.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agenttune.entrypoints.train import train_from_config
from agenttune.registry.config_loading import load_config
from agenttune.testing.faults import (
    JOURNAL,
    PLAN,
    Snapshot,
    check_run,
    failing_generate,
    repeat_of,
)

pytest.importorskip("torch")

TINY = "tiny://faults?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
TASKS = 16
NUM_REPEAT = 4


def write_tasks(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"task_id": f"task-{index:02d}", "query": f"Say something about {index}."} for index in range(TASKS)]
    (path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config_for(tmp_path: Path, **sections: Any) -> Any:
    data: dict[str, Any] = {
        "project_name": "faults",
        "workflow": "agenttune.testing.faults:FaultyWorkflow",
        "judge": {"judge_protocol": "agenttune.testing.faults:FaultyJudge", "timeout": 10},
        "task_reader": {"type": "file", "path": str(write_tasks(tmp_path / "data") / "{split}.jsonl")},
        "model": {"path": TINY, "max_model_len": 256},
        "engine": {"type": "hf"},
        "rollout": {"num_repeat": NUM_REPEAT, "max_env_worker": 64, "episode_timeout": 10.0,
                    "max_response_length_in_one_turn": 8, "compute_madness_checklist": []},
        "monitor": {"tensorboard": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return load_config(data)


@pytest.fixture
def faults(monkeypatch):
    """Inject engine faults into the hf engine; yield what was running before the run."""
    from agenttune.components.engines.hf import HFEngine

    JOURNAL.clear()
    monkeypatch.setattr(HFEngine, "generate", failing_generate(HFEngine.generate))
    yield Snapshot.take()
    JOURNAL.clear()


def planned(task_ids: list[str]) -> set[str | None]:
    return {PLAN.fault(task_id, repeat) for task_id in task_ids for repeat in range(NUM_REPEAT)}


def test_the_plan_covers_every_fault_in_each_run():
    every = {None, "raise", "hang", "engine", "flaky", "judge"}
    assert planned([f"task-{index:02d}" for index in range(TASKS)]) == every  # the local run's tasks
    assert planned([f"task-{index:02d}" for index in range(8)]) == every  # the debug run's first 8
    assert repeat_of("a1b2c3-7-3") == 3


def test_the_soak_plan_gives_every_fault_to_some_of_its_episodes():
    from collections import Counter

    from agenttune.testing.faults import EXPECTED_STATUS, SOAK_PLAN

    drawn = Counter(SOAK_PLAN.fault(f"task-{index:02d}", repeat) for index in range(16) for repeat in range(4))
    assert set(drawn) == set(EXPECTED_STATUS) and min(drawn.values()) >= 2  # bench/soak.py's 16 tasks x 4


@pytest.mark.slow
def test_a_debug_run_finishes_and_counts_every_failure(tmp_path, faults):
    config = config_for(tmp_path, backbone="debug", debug={"first_n_tasks": 8, "max_parallel": 32})
    run = train_from_config(config, run_dir=tmp_path / "run")
    [report] = check_run(run.run_dir, steps=[1], episodes_per_step=8 * NUM_REPEAT)
    assert {"ok", "workflow_error", "timeout", "engine_error", "judge_error"} <= set(report.statuses)
    assert faults.new_threads() == [] and faults.new_children() == {}


@pytest.mark.slow
def test_a_local_training_run_finishes_its_steps_and_counts_every_failure(tmp_path, faults):
    config = config_for(tmp_path, backbone="local",
                        data={"train_batch_size": 8, "max_prompt_length": 128, "max_response_length": 64},
                        trainer={"total_steps": 3, "save_freq": 1, "learning_rate": 1e-3},
                        local={"device": "cpu", "plot": False, "keep_checkpoints": 1})
    run = train_from_config(config, run_dir=tmp_path / "run")
    reports = check_run(run.run_dir, steps=[1, 2, 3], episodes_per_step=8 * NUM_REPEAT)
    seen = set().union(*(report.statuses for report in reports))
    assert {"ok", "workflow_error", "timeout", "engine_error", "judge_error"} <= seen
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    for step, report in zip(metrics, reports, strict=True):  # failed episodes are kept out of GRPO, not trained
        failed = sum(count for status, count in report.statuses.items() if status != "ok")
        assert step["train/failed_episodes_skipped"] == failed
    assert sum(step["train/updates"] for step in metrics) >= 1 and sum(step["train/trained_tokens"] for step in metrics) > 0
    assert (run.checkpoints_dir / "step_000003" / "state.json").exists()
    assert faults.new_threads() == [] and faults.new_children() == {}
