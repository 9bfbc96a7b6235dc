"""A workflow that blocks its worker's event loop (a synchronous call inside `async def execute`)
cannot freeze the run: its episode times out, the worker is killed and replaced, and later episodes
run on the new one."""

from __future__ import annotations

import time

import pytest

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus


class BlocksItsLoop(Workflow):
    async def execute(self, task, tuner):
        if task.task_id == "block":
            time.sleep(3600)  # blocks the worker's event loop: cancellation cannot reach it
        return WorkflowOutput(reward=1.0)


@pytest.mark.slow
async def test_a_workflow_blocking_its_workers_loop_times_out_and_the_worker_is_replaced(monkeypatch):
    monkeypatch.setattr("agenttune.rollout.rollout_engine.CANCEL_GRACE_S", 0.5)
    monkeypatch.setattr("agenttune.rollout.workers.CANCEL_ANSWER_S", 1.0)
    config = tiny_config(rollout={"num_repeat": 1, "episode_timeout": 10.0, "workflow_processes": 2,
                                  "compute_madness_checklist": []})
    async with running_gateway(ScriptedEngine(tokenizer=tiny_tokenizer()), config=config) as gateway:
        async with RolloutEngine(config, gateway, BlocksItsLoop) as rollout:
            first = await rollout.run_tasks([Task(task_id="block", query="q"), Task(task_id="ok", query="q")])
            again = await rollout.run_tasks([Task(task_id=f"ok-{index}", query="q") for index in range(4)])
            alive = [worker.process.is_alive() for worker in rollout._processes._workers]
    assert [episode.status for episode in first] == [EpisodeStatus.TIMEOUT, EpisodeStatus.OK]
    assert "ran past rollout.episode_timeout=10s" in first[0].error
    assert [episode.status for episode in again] == [EpisodeStatus.OK] * 4, [e.error for e in again]
    assert alive == [True, True]  # the killed worker was replaced
