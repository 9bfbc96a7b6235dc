"""`rollout.workflow_processes`: workflows and their gateways in worker processes, the engine in the trainer's.

The rollout engine's own tests (tests/rollout/test_rollout_engine.py) run their main cases both ways; these
cover what only worker processes have: where the code runs, each worker's own gateway (HTTP too),
engine calls that must stop when their episode does, a worker that dies, cleanups that must run
where the workflow registered them, and what cannot cross a process boundary.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from agenttune import Judge, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.base import Generation, InferenceEngine
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.errors import UserError
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EnvironmentFailure, EpisodeStatus


def config_with(processes: int = 2, **rollout):
    return tiny_config(rollout={"num_repeat": 1, "max_env_worker": 8, "episode_timeout": 30,
                                "workflow_processes": processes, **rollout})


def tasks(*modes: str, **metadata) -> list[Task]:
    return [Task(task_id=f"{mode}-{index}", query=f"Question {index}?", metadata={"mode": mode, **metadata})
            for index, mode in enumerate(modes)]


class WhereWorkflow(Workflow):
    """One chat call; says which process it ran in, and acts out its task's mode."""

    async def execute(self, task, tuner):
        mode = task.metadata["mode"]
        if mode == "die":
            os._exit(9)
        if mode == "environment":
            raise EnvironmentFailure("the environment server went away")
        if mode == "broken":
            raise ValueError("a bug in the workflow")
        client = tuner.as_async_openai_client(http=mode == "http")
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.query}])
        tuner.update_judge_input_dictionary(answer=reply.choices[0].message.content)
        if mode == "unsendable":
            return WorkflowOutput(reward=1.0, metadata={"callback": lambda: None})
        if "log" in task.metadata:
            tuner.add_cleanup(lambda: _append(task.metadata["log"], f"cleanup {os.getpid()}"))
        return WorkflowOutput(metadata={"pid": os.getpid(), "parent": os.getppid(), "base_url": tuner.base_url})


class AnswerJudge(Judge):
    name = "answer_processes_test"

    def judge(self, judge_input):
        if "log" in judge_input.task.metadata:
            _append(judge_input.task.metadata["log"], "judge")
        answer = judge_input.handed.get("answer")
        return JudgeResult(reward=float(answer == "It is blue."), success=answer == "It is blue.")


def _append(path: str, line: str) -> None:
    with open(path, "a") as log:
        log.write(line + "\n")


def engine():
    return ScriptedEngine(["It is blue."], tokenizer=tiny_tokenizer(), cycle=True)


@pytest.mark.slow
async def test_workflows_run_in_the_workers_and_the_trainer_keeps_the_record():
    config = config_with(processes=2)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            episodes = await rollout.run_tasks(tasks(*["ok"] * 8))
            workers = {child.pid for child in multiprocessing.active_children()}
    assert all(episode.status is EpisodeStatus.OK for episode in episodes), [e.error for e in episodes]
    pids = {episode.output["pid"] for episode in episodes}
    assert len(pids) == 2 and os.getpid() not in pids and pids <= workers
    assert {episode.output["parent"] for episode in episodes} == {os.getpid()}
    for episode in episodes:  # judged here, with what the workflow handed over there
        assert (episode.reward, episode.metrics["calls"]) == (1.0, 1)
        [sample] = episode.samples
        assert tiny_tokenizer().decode(sample.response_ids, skip_special_tokens=True) == "It is blue."
    assert not pids & {child.pid for child in multiprocessing.active_children()}  # stopped at the end


async def test_a_workflow_error_in_a_worker_keeps_its_kind():
    """EnvironmentFailure raised in a worker is the episode's environment_error, as in-process."""
    config = config_with(processes=1)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            environment, broken = await rollout.run_tasks(tasks("environment", "broken"))
    assert environment.status is EpisodeStatus.ENVIRONMENT_ERROR
    assert environment.error.startswith("EnvironmentFailure: the environment server went away")
    assert broken.status is EpisodeStatus.WORKFLOW_ERROR and broken.error.startswith("ValueError: a bug")


@pytest.mark.slow
async def test_batches_started_side_by_side_share_the_workers():
    """Asynchronous training runs a batch per group at once: each used to start workers of its own."""
    config = config_with(processes=2)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            batches = await asyncio.gather(*(rollout.run_tasks(tasks("ok", "ok")) for _ in range(6)))
    episodes = [episode for batch in batches for episode in batch]
    assert all(episode.status is EpisodeStatus.OK for episode in episodes), [e.error for e in episodes]
    assert len({episode.output["pid"] for episode in episodes}) == 2


@pytest.mark.slow
async def test_a_worker_that_dies_fails_only_its_own_episodes_and_is_replaced():
    config = config_with(processes=2, max_env_worker=4)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            first = await rollout.run_tasks(tasks("die", "ok", "ok", "ok"))
            second = await rollout.run_tasks(tasks(*["ok"] * 4))
            [unsendable] = await rollout.run_tasks(tasks("unsendable"))
            [unsendable_task] = await rollout.run_tasks(tasks("ok", hook=lambda: None))
            after = await rollout.run_tasks(tasks("ok", "ok"))
    died = first[0]
    assert died.status is EpisodeStatus.WORKFLOW_ERROR
    assert "the workflow process exited (exit code 9) while running this episode" in died.error
    assert died.reward == 0.0 and not died.success
    # Its neighbours on the other worker finished; one on the same worker may have gone down with it.
    assert sum(episode.status is EpisodeStatus.OK for episode in first[1:]) >= 1
    assert [episode.status for episode in second] == [EpisodeStatus.OK] * 4, [e.error for e in second]
    assert len({episode.output["pid"] for episode in second}) == 2
    # A result that cannot be pickled is that episode's error, and its worker lives on.
    assert unsendable.status is EpisodeStatus.WORKFLOW_ERROR
    assert "cannot be sent back from the workflow process" in unsendable.error
    # So is a task that cannot be sent to one, and the workers go on.
    assert unsendable_task.status is EpisodeStatus.WORKFLOW_ERROR and "pickle" in unsendable_task.error
    assert [episode.status for episode in after] == [EpisodeStatus.OK] * 2


@pytest.mark.slow
async def test_cleanups_run_in_the_worker_after_the_judge(tmp_path: Path):
    log = tmp_path / "order.log"
    config = config_with(processes=2)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            [episode] = await rollout.run_tasks(tasks("ok", log=str(log)))
    assert episode.status is EpisodeStatus.OK, episode.error
    assert log.read_text().splitlines() == ["judge", f"cleanup {episode.output['pid']}"]
    assert episode.output["pid"] != os.getpid()


async def test_a_workflow_that_cannot_be_imported_by_name_is_a_clear_error():
    class LocalWorkflow(Workflow):
        async def execute(self, task, tuner):
            return WorkflowOutput(reward=1.0)

    config = config_with(processes=2)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, LocalWorkflow) as rollout:
            with pytest.raises(UserError) as raised:
                await rollout.run_tasks(tasks("ok"))
    message = str(raised.value) + " " + (raised.value.hint or "")
    assert "can be imported by name in another process" in message and "LocalWorkflow" in message
    assert "workflow_processes: 1" in message


@pytest.mark.slow
async def test_each_worker_serves_its_episodes_over_http_too():
    """Agent frameworks reach the model at `tuner.base_url`: in a worker, its own gateway's address."""
    config = config_with(processes=2)
    async with running_gateway(engine(), config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            episodes = await rollout.run_tasks(tasks(*["http"] * 4))
        trainers = gateway.base_url
    assert all(episode.status is EpisodeStatus.OK for episode in episodes), [e.error for e in episodes]
    assert all(episode.reward == 1.0 and episode.metrics["calls"] == 1 for episode in episodes)
    urls = {episode.output["pid"]: episode.output["base_url"] for episode in episodes}
    assert len(set(urls.values())) == len(urls) == 2  # one gateway per worker
    assert all(url.startswith("http://127.0.0.1:") and url != trainers for url in urls.values())


class StuckEngine(InferenceEngine):
    """Never answers; notes each call that was cancelled (what an episode timeout must do to it)."""

    def __init__(self):
        self.started: list[str] = []
        self.cancelled: list[str] = []

    async def generate(self, prompt_ids, sampling, *, request_id=None) -> Generation:
        self.started.append(request_id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        raise AssertionError("unreachable")


@pytest.mark.slow
async def test_an_episode_that_times_out_in_a_worker_cancels_its_engine_call():
    stuck = StuckEngine()
    # 4 s: the worker process must start and make its call before the timeout, also on a loaded machine.
    config = config_with(processes=2, episode_timeout=4)
    async with running_gateway(stuck, config=config) as gateway:
        async with RolloutEngine(config, gateway, WhereWorkflow, AnswerJudge()) as rollout:
            [episode] = await rollout.run_tasks(tasks("ok"))
            deadline = time.monotonic() + 5
            while not stuck.cancelled and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            cancelled = list(stuck.cancelled)  # before stopping the workers, which would cancel it too
    assert episode.status is EpisodeStatus.TIMEOUT, episode.error
    assert stuck.started == [episode.episode_id], "the episode's call never reached the engine before it timed out"
    assert cancelled == [episode.episode_id]  # the trainer's engine stopped generating for it
