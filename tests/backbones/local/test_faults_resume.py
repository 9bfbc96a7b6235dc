"""Crash and resume: `kill -9` a local training process between checkpoints, resume it, and compare
with a run that was never interrupted (same config, same seed).

The resumed run must go on from the last checkpoint exactly: every step appears once in
metrics.jsonl, the steps after the checkpoint train on the same tasks (the data position was kept)
with the same rollouts, and the final weights are bitwise those of the uninterrupted run (weights,
optimizer, schedule and random state were all restored). Episodes run one at a time with batch-1
generation, so both runs do the very same floating-point work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")

TINY = "tiny://crash?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
TOTAL_STEPS = 5
SAVE_FREQ = 2  # checkpoints after steps 2, 4 and 5: the crash comes after step 3
WORKFLOW = '''
import asyncio
from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput


class Agent(Workflow):
    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.query}])
        await asyncio.sleep(0.02)  # a step takes long enough that the crash lands between checkpoints
        return WorkflowOutput(metadata={"final_answer": reply.choices[0].message.content or ""})


class EvenJudge(Judge):
    async def judge(self, judge_input):
        even = len(judge_input.final_answer or "") % 2 == 0
        return JudgeResult(reward=float(even), success=even)
'''


def write_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "crash_agent.py").write_text(WORKFLOW)
    rows = [{"task_id": f"task-{index:02d}", "query": f"Count to {index}."} for index in range(10)]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config: dict[str, Any] = {
        "project_name": "crash",
        "workflow": "crash_agent:Agent",
        "judge": {"judge_protocol": "crash_agent:EvenJudge"},
        "backbone": "local",
        "task_reader": {"type": "file", "path": str(root / "{split}.jsonl")},
        "model": {"path": TINY, "max_model_len": 128},
        "engine": {"type": "hf"},
        "rollout": {"num_repeat": 4, "max_env_worker": 1, "temperature": 1.0, "max_response_length_in_one_turn": 6,
                    "compute_madness_checklist": []},
        "data": {"train_batch_size": 4, "max_prompt_length": 64, "max_response_length": 16},
        "trainer": {"total_steps": TOTAL_STEPS, "save_freq": SAVE_FREQ, "learning_rate": 1e-2, "seed": 3},
        "local": {"device": "cpu", "plot": False, "keep_checkpoints": 5},
        "monitor": {"tensorboard": False},
    }
    path = root / "crash.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(conf: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTTUNE_") or key == "AGENTTUNE_CACHE_DIR"}
    return subprocess.Popen([sys.executable, "-m", "agenttune", "train", "--conf", str(conf), "--run-dir", str(run_dir),
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**env, "OMP_NUM_THREADS": "1"})


def steps_written(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def kill_after_step(victim: subprocess.Popen, run_dir: Path, step: int) -> None:
    """SIGKILL the run as soon as `step` is in its metrics (before the next checkpoint); also when the step
    never comes, so that a failing test leaves no training run behind."""
    deadline = time.monotonic() + 600  # a hang's limit (a step takes seconds), generous for a loaded machine
    try:
        while step not in steps_written(run_dir):
            assert victim.poll() is None, f"the run ended before the crash: {victim.stderr.read()}"
            assert time.monotonic() < deadline, f"step {step} never finished"
            time.sleep(0.01)
    finally:
        victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL


def checkpoints(run_dir: Path) -> list[str]:
    folder = run_dir / "checkpoints"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def episodes(run_dir: Path, step: int) -> list[dict[str, Any]]:
    path = run_dir / "rollouts" / f"step_{step:06d}_train.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def weights(checkpoint: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(checkpoint / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted run, and one killed with SIGKILL after step 3 then resumed with --resume."""
    from agenttune.components.engines.model_loading import resolve_model_path

    resolve_model_path(TINY)  # built once here, not by both runs at once
    root = tmp_path_factory.mktemp("crash")
    conf = write_project(root / "project")
    straight, crashed = root / "straight", root / "crashed"
    uninterrupted = train(conf, straight)
    try:
        kill_after_step(train(conf, crashed), crashed, 3)
    except BaseException:
        uninterrupted.kill()
        raise
    at_crash = {"steps": steps_written(crashed), "checkpoints": checkpoints(crashed)}
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read()
    resumed = train(conf, crashed, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    return {"straight": straight, "crashed": crashed, "at_crash": at_crash}


@pytest.mark.slow
def test_the_crash_came_between_checkpoints(runs):
    assert runs["at_crash"]["steps"] == [1, 2, 3]
    assert runs["at_crash"]["checkpoints"] == ["step_000002"]  # step 3 was trained but never saved


def test_every_step_is_in_the_metrics_once(runs):
    assert steps_written(runs["crashed"]) == list(range(1, TOTAL_STEPS + 1))
    assert checkpoints(runs["crashed"]) == checkpoints(runs["straight"]) == ["step_000002", "step_000004", "step_000005"]


def test_the_data_position_continues_from_the_checkpoint(runs):
    for step in range(1, TOTAL_STEPS + 1):
        straight = sorted({episode["task"]["task_id"] for episode in episodes(runs["straight"], step)})
        resumed = sorted({episode["task"]["task_id"] for episode in episodes(runs["crashed"], step)})
        assert resumed == straight, f"step {step} trained on other tasks after the resume"


def test_the_rollout_log_holds_each_step_once(runs):
    for step in range(1, TOTAL_STEPS + 1):
        logged = episodes(runs["crashed"], step)
        assert len(logged) == 16, f"step {step}: {len(logged)} episodes in the log (the killed run's step 3 twice?)"


def test_rollouts_metrics_and_weights_match_the_uninterrupted_run(runs):
    for step in range(1, TOTAL_STEPS + 1):  # the same sampled tokens, hence the same rewards
        straight = [episode["samples"][0]["response_ids"] for episode in episodes(runs["straight"], step)]
        resumed = [episode["samples"][0]["response_ids"] for episode in episodes(runs["crashed"], step)]
        assert sorted(resumed) == sorted(straight), f"step {step} sampled differently after the resume"
    straight_metrics = [json.loads(line) for line in (runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    resumed_metrics = [json.loads(line) for line in (runs["crashed"] / "metrics.jsonl").read_text().splitlines()]
    for before, after in zip(straight_metrics, resumed_metrics, strict=True):
        for name in ("reward/mean", "train/loss", "train/grad_norm", "train/lr"):
            assert after[name] == before[name], (before["step"], name)
    final_straight = weights(runs["straight"] / "checkpoints" / "step_000005")
    final_resumed = weights(runs["crashed"] / "checkpoints" / "step_000005")
    initial = weights(runs["crashed"] / "checkpoints" / "step_000002")
    assert any(not torch.equal(final_straight[name], initial[name]) for name in initial), "nothing was trained"
    for name, tensor in final_straight.items():
        assert torch.equal(final_resumed[name], tensor), f"{name} differs after the resume"
