"""An async workflow that blocks the event loop (time.sleep, a busy loop, a blocking socket) cannot
freeze the run: the loop watchdog interrupts it at rollout.episode_timeout, the episode ends
`workflow_blocked`, the others go on."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.metrics import step_metrics
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus


class Blocks(Workflow):
    """Blocks its event loop the way the task id says; `ok` returns at once."""

    async def execute(self, task, tuner):
        if task.task_id == "sleep":
            time.sleep(30)
        elif task.task_id == "busy":
            while True:
                pass
        elif task.task_id == "swallows":  # an agent loop that retries on any Exception
            while True:
                try:
                    time.sleep(30)
                except Exception:
                    continue
        elif task.task_id == "socket":
            left, right = socket.socketpair()
            with left, right:
                left.recv(1)  # nothing is ever sent
        return WorkflowOutput(reward=1.0, success=True)


async def roll_out(task_ids: list[str], episode_timeout: float) -> list:
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": 8, "episode_timeout": episode_timeout,
                                  "compute_madness_checklist": []})
    async with running_gateway(ScriptedEngine(tokenizer=tiny_tokenizer()), config=config, http=False) as gateway:
        async with RolloutEngine(config, gateway, Blocks) as rollout:
            return await rollout.run_tasks([Task(task_id=task_id, query="q") for task_id in task_ids])


@pytest.mark.slow
async def test_blocking_async_workflows_end_workflow_blocked_and_the_batch_goes_on():
    before = signal.getsignal(signal.SIGUSR2)
    started = time.monotonic()
    episodes = await roll_out(["sleep", "ok", "busy", "swallows", "socket", "ok"], episode_timeout=2)
    elapsed = time.monotonic() - started
    statuses = {episode.task.task_id: episode.status for episode in episodes}
    assert statuses == {"sleep": EpisodeStatus.WORKFLOW_BLOCKED, "busy": EpisodeStatus.WORKFLOW_BLOCKED,
                        "swallows": EpisodeStatus.WORKFLOW_BLOCKED, "socket": EpisodeStatus.WORKFLOW_BLOCKED,
                        "ok": EpisodeStatus.OK}
    assert elapsed < 20, elapsed  # one time.sleep(30) alone would take longer
    sleeper = episodes[0]
    assert "rollout.episode_timeout" in sleeper.error and "rollout.workflow_processes" in sleeper.error
    assert "time.sleep(30)" in sleeper.error  # where it was blocked: the workflow's own line
    assert "while True" in episodes[2].error or "pass" in episodes[2].error
    metrics = step_metrics(episodes)
    assert metrics["failures/workflow_blocked"] == 4
    assert signal.getsignal(signal.SIGUSR2) == before  # the handler is put back when the engine closes


async def test_a_workflow_that_awaits_is_never_interrupted_and_ends_timeout():
    class Awaits(Workflow):
        async def execute(self, task, tuner):
            import asyncio

            await asyncio.sleep(30)

    config = tiny_config(rollout={"num_repeat": 1, "episode_timeout": 0.5, "compute_madness_checklist": []})
    async with running_gateway(ScriptedEngine(tokenizer=tiny_tokenizer()), config=config, http=False) as gateway:
        async with RolloutEngine(config, gateway, Awaits) as rollout:
            [episode] = await rollout.run_tasks([Task(task_id="t", query="q")])
    assert episode.status is EpisodeStatus.TIMEOUT, episode.error


@pytest.mark.slow
def test_a_debug_run_with_a_sleeping_workflow_finishes(tmp_path):
    """End to end, through Trainer and the debug backbone (the loop runs in the main thread)."""
    from agenttune import Trainer

    config = {"model": {"path": "tiny://default", "max_model_len": 1024},
              "engine": {"type": "scripted", "replies": ["42"]},
              "rollout": {"num_repeat": 2, "episode_timeout": 2, "compute_madness_checklist": []},
              "debug": {"first_n_tasks": 2, "max_parallel": 4}}
    rows = [{"task_id": task_id, "query": "q"} for task_id in ("sleep", "ok")]
    started = time.monotonic()
    run = Trainer(config, workflow=Blocks, train_dataset=rows, backbone="debug", run_dir=tmp_path / "run").train()
    assert time.monotonic() - started < 25
    records = [json.loads(line) for line in (run.rollouts_dir / "step_000001_train.jsonl").read_text().splitlines()]
    assert sorted((record["task"]["task_id"], record["status"]) for record in records) == [
        ("ok", "ok"), ("ok", "ok"), ("sleep", "workflow_blocked"), ("sleep", "workflow_blocked")]
    metrics = json.loads(run.metrics_path.read_text().splitlines()[0])
    assert metrics["failures/workflow_blocked"] == 2
